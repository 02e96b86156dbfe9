// The link's limit for a recorded step (issue 48): given every allocation a
// step makes, frees and uses, and a device part of `device_bytes`, how many
// bytes must cross between host and device. Reports a feasible schedule (an
// offline heuristic that knows the whole step) and a lower bound that no
// schedule can beat; a learned placement is checked against both.
//
// The model. Time is the step's event sequence. A use is one kernel: every
// allocation it names must be wholly resident on the device at once, and
// nothing else is required. Transfers move whole allocations:
//  - an allocation made in the step holds no data until its first use, which
//    creates it on the device (no transfer); its data then exists there only;
//  - a carried allocation (`Live`: it exists when the step begins) holds its
//    data on the host when the step begins, except, when the step repeats,
//    a persistent one (carried and never freed in the step), which is where
//    the previous step left it (the steady state);
//  - bringing data to the device costs its bytes host→device (H2D);
//  - evicting data that is needed later costs its bytes device→host (D2H)
//    if it was written on the device since the host last held it (dirty),
//    nothing if the host's copy is still valid; data not needed later is
//    dropped for nothing (freed or discarded);
//  - data is needed after its last use in the step only if the allocation is
//    persistent: when the step repeats its next use is in the next step;
//    when it does not, it is kept (resident, or valid on the host) but never
//    used again. What an allocation made in the step holds after its last
//    use, and what a carried one that the step frees holds, is dead.
//
// Pure functions and value types: no locks, no backend calls.
// Thread-compatible.
#ifndef CMA_POLICY_OFFLINE_SCHEDULE_H_
#define CMA_POLICY_OFFLINE_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace cma {

// How a kernel touches an allocation. A write makes the device's copy the
// only valid one; a read leaves a valid host copy valid.
enum class AccessMode { kRead, kWrite, kReadWrite };

struct StepAccess {
  std::uint64_t id = 0;
  AccessMode mode = AccessMode::kReadWrite;
};

// One recorded step, built event by event. Every id names one allocation:
// it is declared once (Live or Alloc) before it is used or freed, is never
// used after its free, and is never freed twice; each call rejects an event
// that breaks these rules with kInvalidArgument naming the id, and leaves
// the step as it was.
class Step {
 public:
  // An allocation that exists when the step begins (parameters, optimizer
  // state, the previous step's leftovers), wherever its line appears.
  // `movable`: the bytes of it that a move takes off the device (the rest
  // stays counted there while it is away: pages it shares with neighbours);
  // only PlanReplay (policy/replay_schedule.h) reads it, the offline
  // schedule and bound move whole allocations.
  static constexpr std::size_t kAllMovable = ~std::size_t{0};
  absl::Status Live(std::uint64_t id, std::size_t bytes, std::size_t movable = kAllMovable);
  // An allocation made during the step.
  absl::Status Alloc(std::uint64_t id, std::size_t bytes, std::size_t movable = kAllMovable);
  // One kernel; an id named twice is one access with both modes.
  absl::Status Use(absl::Span<const StepAccess> accesses);
  absl::Status Free(std::uint64_t id);

  struct Allocation {
    std::uint64_t id = 0;
    std::size_t bytes = 0;
    std::size_t movable = kAllMovable;  // see Live
    std::size_t movable_bytes() const { return movable < bytes ? movable : bytes; }
    bool carried = false;          // declared by Live
    std::int64_t alloc_event = -1;  // its Alloc's event index (-1: carried)
    std::int64_t free_event = -1;   // its Free's event index (-1: not freed)
    std::int64_t first_use = -1;    // event index (-1: never used)
    std::int64_t last_use = -1;
    // Carried and never freed: its data outlives the step.
    bool persistent() const { return carried && free_event < 0; }
  };
  struct Access {
    std::int32_t allocation = 0;  // index into allocations()
    bool writes = false;
  };
  enum class Kind { kAlloc, kUse, kFree };
  struct Event {
    Kind kind = Kind::kUse;
    std::int32_t allocation = -1;  // kAlloc, kFree
    std::int64_t access_begin = 0;  // kUse: [begin, end) of accesses()
    std::int64_t access_end = 0;
  };

  const std::vector<Allocation>& allocations() const { return allocations_; }
  const std::vector<Event>& events() const { return events_; }
  const std::vector<Access>& accesses() const { return accesses_; }
  // The allocation's index, or -1.
  std::int32_t IndexOf(std::uint64_t id) const;

 private:
  absl::Status Declare(std::uint64_t id, std::size_t bytes, std::size_t movable, bool carried);

  std::vector<Allocation> allocations_;
  std::vector<Event> events_;
  std::vector<Access> accesses_;
  absl::flat_hash_map<std::uint64_t, std::int32_t> index_;
};

struct ScheduleOptions {
  std::size_t device_bytes = 0;  // the device part
  bool repeat = false;           // the step repeats: report the steady state
  // Repeat: steps simulated from a cold start while looking for the cycle
  // the heuristic settles into.
  int max_steps = 32;
  // Repeat: the lower bound's longest window, in steps (its figure
  // approaches the steady state's LP from below as the window grows).
  int max_bound_steps = 32;
  bool record_moves = true;
};

// Sizes of the step itself, independent of the device part.
struct StepFacts {
  // Most bytes allocated at once (carried ones from the start to their
  // free): what the framework's allocator counts as allocated at its peak.
  std::size_t live_peak = 0;
  // The least device part with which only the unavoidable cold fetches
  // cross: at some kernel, its allocations plus every other allocation
  // holding data that is needed later.
  std::size_t working_peak = 0;
  // The largest kernel: every device part must hold it.
  std::size_t largest_use = 0;
  std::int64_t uses = 0;
  // Carried allocations that the step frees but uses first: they start on
  // the host every step (the model cannot tell where the step before left
  // them), so each costs a fetch; a recorder should make such data
  // persistent.
  std::size_t carried_freed_used = 0;
  std::size_t carried_freed_used_bytes = 0;
};
StepFacts MeasureStep(const Step& step, bool repeat);

struct LinkBytes {
  std::uint64_t h2d = 0;
  std::uint64_t d2h = 0;
};

struct ScheduleMove {
  enum class Kind {
    kWriteBack,  // evicted, dirty and needed later: D2H
    kDrop,       // evicted, needed later, host copy valid: no transfer
    kFetch,      // brought back before its use: H2D
  };
  Kind kind = Kind::kFetch;
  std::int64_t before_event = 0;  // index in the step's events
  std::uint64_t id = 0;
  std::size_t bytes = 0;
};

struct OfflineSchedule {
  // Bytes over `steps` consecutive steps: 1 unless the step repeats and
  // the heuristic's steady state is a cycle of several steps.
  LinkBytes bytes;
  int steps = 1;
  // Repeat: whether the steady state was reached within max_steps
  // (otherwise `bytes` are those of the last max_steps / 2 steps).
  bool steady = true;
  double h2d_per_step() const { return static_cast<double>(bytes.h2d) / steps; }
  double d2h_per_step() const { return static_cast<double>(bytes.d2h) / steps; }
  // The moves of one step (the first of the cycle when it repeats),
  // excluding creations at first use and drops of dead data, which cost
  // nothing.
  std::vector<ScheduleMove> moves;
  // Declared allocations the step never uses: they never enter the device.
  std::vector<std::uint64_t> never_resident;
  std::size_t peak_resident = 0;
};

// The heuristic: demand fetching, and when a use needs room, Belady's rule:
// evict the resident allocation whose next use is farthest (data kept past
// its last use first; ties: the larger, then the clean one). Feasible by
// construction; for one step alone, optimal in bytes when every allocation
// has the same size and every use writes (tested against an exhaustive
// search; with sizes that vary, or reads, it may move more than the
// optimum). kFailedPrecondition when a kernel alone exceeds the device part.
absl::StatusOr<OfflineSchedule> PlanOfflineSchedule(const Step& step,
                                                    const ScheduleOptions& options);

// Per step, bytes that every schedule moves at least, each direction on
// its own (no schedule need reach both at once). Repeat: at most the
// average per step of every periodic schedule, whatever its period (the
// steady state of a repeating step). kFailedPrecondition as above.
struct LinkLowerBound {
  double h2d = 0;
  double d2h = 0;
  // Of these, the cold fetches: carried data used after starting on the host.
  double cold_h2d = 0;
  // Repeat: the window (in steps) that gave the H2D figure.
  int window_steps = 1;
};
absl::StatusOr<LinkLowerBound> LowerBoundLinkBytes(const Step& step,
                                                   const ScheduleOptions& options);

}  // namespace cma

#endif  // CMA_POLICY_OFFLINE_SCHEDULE_H_
