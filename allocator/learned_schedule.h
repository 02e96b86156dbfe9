// LearnedSchedule: the step the allocator learns (config learn_step:1).
//
// A training or serving step repeats: the same allocations, frees and uses,
// in the same order. Between two MarkIteration calls this records one step
// as policy/offline_schedule.h's Step (the allocation sequence and the uses
// the framework reports are the clock; an allocation made in the step is
// named by its ordinal in the step, one that lives through the step by its
// address), and at the step's end asks policy/replay_schedule.h for a plan:
// which live allocations go away to the host, before which event, and
// which come back. The next steps replay the plan on the clock of the uses
// the framework reports (their order is the model's, which no placement
// changes; allocations and frees move with offloads that adapt): each
// action is due at the use before which its event came, an allocation made
// in the step is the one with its ordinal and size (or none). A use that
// reports another number of pointers than the recorded one drops the plan
// for the rest of the step, and that step, recorded as always, plans the
// next (a new sequence length, eval, another batch). A step that repeated
// the recorded one keeps its plan; one whose allocations differ plans anew.
//
// Pure bookkeeping: it decides nothing itself and makes no backend call;
// DeviceAllocator (allocator/learn_step.cc) carries out what is due.
// Internal to allocator/; guarded by the owning DeviceAllocator's mutex.
#ifndef CMA_ALLOCATOR_LEARNED_SCHEDULE_H_
#define CMA_ALLOCATOR_LEARNED_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "allocator/transfer_thread.h"
#include "backends/backend.h"
#include "policy/offline_schedule.h"
#include "policy/replay_schedule.h"

namespace cma {

class LearnedSchedule {
 public:
  // What the plan has due before an event: allocations (by address) to send
  // away and to bring back, in the plan's order.
  struct Due {
    std::vector<std::uintptr_t> send;
    std::vector<std::uintptr_t> bring;
    bool empty() const { return send.empty() && bring.empty(); }
    void clear() {
      send.clear();
      bring.clear();
    }
  };
  struct Counts {
    std::int64_t steps = 0;        // steps ended (MarkIteration)
    std::int64_t plans = 0;        // plans made
    std::int64_t divergences = 0;  // replays a differing event ended
  };

  // What an allocation counts in the plan: the bytes it holds on the device
  // where the plan makes room for it, and of those the bytes a send away
  // takes off (the rest, pages it shares with neighbours, stays counted).
  struct Extent {
    std::size_t device_bytes = 0;
    std::size_t movable_bytes = 0;
  };
  // A step begins; `live` are the allocations that exist now, with their
  // extents: 0 device bytes for one the host tier holds (routed there, or
  // placed there because the device was full: a carried allocation is never
  // made again, so it never lands on the device).
  void BeginStep(absl::Span<const std::pair<std::uintptr_t, Extent>> live);
  // The step ends: what the plan still had due fills `due`; then, unless
  // the step replayed the plan to its end, plans the next from it under
  // `options` (policy/replay_schedule.h). A plan the policy refuses (a use
  // larger than the device part) leaves none: the next steps run as
  // without learning. Returns the policy's refusal, if any.
  absl::Status EndStep(const ReplayPlanOptions& options, Due* due);

  // The events of the step, in order; each fills `due` with what is due
  // before it (cleared first). The clock does not depend on where the
  // allocations went (the plan changes that): every allocation, every free
  // of one the step knows, every use reported is an event. An allocation
  // is two calls: Alloc before it is made (`bytes`: the request, rounded),
  // AllocDone with its address and extent once it is: its size on the
  // device wherever it went (one the host tier took because the device was
  // full lands on the device once the plan makes room, so the plan does not
  // shrink with where allocations happened to go and stands from step to
  // step), or 0 for one the caller routed to the host for good; one that
  // failed has no AllocDone. A step whose allocations' device bytes differ
  // from the planned step's (a routing that changed) plans anew. A planned
  // move of an allocation that cannot be away is skipped.
  void Alloc(std::size_t bytes, Due* due);
  void AllocDone(std::uintptr_t addr, Extent extent);
  void Free(std::uintptr_t addr, Due* due);
  // One use reporting `reported` pointers, of which `addrs` are this
  // device's allocations (others: memory the step does not track).
  void Use(absl::Span<const std::uintptr_t> addrs, std::size_t reported, Due* due);

  bool has_plan() const { return replaying_; }
  const Counts& counts() const { return counts_; }

 private:
  // Counts an event of the Step (false: too many, the step is not planned).
  bool Record();
  // An Alloc with no AllocDone (it failed) becomes a Step allocation of
  // nothing before the next event.
  void SettleAlloc();
  // Adds to `due` the plan's actions up to the clock's `use`.
  void Collect(std::size_t use, Due* due);
  // The allocation an action's id names in this step (0: none).
  std::uintptr_t AddressOf(std::uint64_t id) const;

  // The step being recorded.
  std::unique_ptr<Step> step_;
  bool recording_ = false;
  bool overflowed_ = false;  // too many events: not planned
  std::size_t events_ = 0;
  absl::flat_hash_map<std::uintptr_t, std::uint64_t> id_of_;  // live -> id
  std::vector<std::uintptr_t> own_address_;  // ordinal -> address this step
  std::vector<std::size_t> own_sizes_;       // ordinal -> request, rounded
  std::vector<std::size_t> own_device_;      // ordinal -> its device bytes
  bool alloc_pending_ = false;               // an Alloc awaits its AllocDone
  std::vector<std::size_t> uses_;            // per use: pointers reported
  // The plan replayed now, the step it came from, and each action's place
  // on the clock (uses before it).
  ReplayPlan plan_;
  std::vector<std::size_t> action_use_;
  std::vector<std::size_t> planned_uses_;
  std::vector<std::size_t> planned_sizes_;
  std::vector<std::size_t> planned_device_;
  bool replaying_ = false;
  bool diverged_ = false;
  std::size_t next_action_ = 0;
  Counts counts_;
};

// What DeviceAllocator keeps to carry out a learned schedule
// (allocator/learn_step.cc).
struct LearnState {
  LearnedSchedule schedule;
  LearnedSchedule::Due due;  // reused: no allocation per event
  // Created on first use: transfers to the host, and back, each on its own
  // stream so that both directions of the link work at once and neither
  // waits behind the step's kernels.
  bool streams = false;
  Stream away_stream = kDefaultStream;
  Stream back_stream = kDefaultStream;
  // Brought back and not yet used: the event after the transfer, which the
  // stream of the allocation's next use waits for, and with
  // learn_transfer_thread the ticket of the call that records it.
  struct Fetch {
    Event event;
    std::uint64_t ticket = 0;
  };
  absl::flat_hash_map<std::uintptr_t, Fetch> fetches;
  // learn_transfer_thread:1: makes the bring-backs' transfer calls and
  // records their events (allocator/transfer_thread.h). Anything that
  // orders after one waits until its call has been made.
  std::unique_ptr<TransferThread> mover;
  // The allocations each bring-back call handed to it carries, by ticket
  // (a failed call's are counted away again); cleared at the step's end.
  absl::flat_hash_map<std::uint64_t, std::vector<std::uintptr_t>> bring_calls;
  std::int64_t misses = 0;  // bring-backs the budget had no room for
  // Microseconds the reporting thread spent issuing sends and bring-backs
  // (the driver's calls, making room): time the step's own launches wait.
  std::int64_t send_host_us = 0;
  std::int64_t bring_host_us = 0;
  // Of which making room (any bring back), and the transfer calls alone.
  std::int64_t room_host_us = 0;
  std::int64_t send_call_host_us = 0;
  std::int64_t bring_call_host_us = 0;
};
}  // namespace cma

#endif  // CMA_ALLOCATOR_LEARNED_SCHEDULE_H_
