// The replay schedule (issue 48): from one recorded step, the moves that
// later steps replay so that the step fits in the device's part and the
// transfers overlap compute. The core carries them out with SendAway and
// BringBack (allocator/caching_managed_allocator.h), stream-ordered: an
// action "at event e" is issued just before the step's event e, after the
// work of the events before it.
//
// The model (it differs from PlanOfflineSchedule's where the core does):
//  - The step repeats; the plan is its steady state and has period one
//    step. A persistent allocation (carried, never freed) is where the
//    previous step left it: what is away at the end of the step is away at
//    its start, and a bring-back may be issued late in the step for a use
//    early in the next one.
//  - An allocation occupies device bytes while it exists and is not away
//    (and, away, its bytes less its movable ones: Step::Live/Alloc):
//    one made in the step from its Alloc event through its Free event (or
//    the step's end), both included, because the core populates a block's
//    pages when it hands it out and releases them only at the free; a
//    carried one that the step frees from the step's start through its
//    Free. The latter is on the device at the start: it is what the
//    previous step made and never freed, which a plan never sends away.
//  - A move leaves for a stretch between two uses of an allocation whose
//    data is needed at the second (a *gap*; for a persistent allocation the
//    gap from its last use to its first use in the next step; for a carried
//    one the step frees, the stretch before its first use). Before its
//    first use, an allocation made in the step holds nothing to move, and
//    after its last use one that is not persistent holds nothing needed:
//    in both stretches it stays (dropping dead data is the free's job).
//  - Bringing data back costs its bytes host to device (H2D). Sending it
//    away costs its bytes device to host (D2H) when it was written on the
//    device since the host last held it (write_back), nothing otherwise
//    (a read-only weight's host copy stays valid where the core keeps one,
//    e.g. read-mostly). A carried allocation that the step frees is taken
//    as written (it was made on the device).
//  - A sent allocation stops counting at the event its send is issued; a
//    brought one counts from the event its bring-back is issued (in flight
//    or arrived). At each event the count is taken after the actions
//    issued before it and with that event's allocation included.
//
// The algorithm, in three passes over a cyclic event line:
//  1. Which gaps leave: a sweep over the events that, wherever the count
//     exceeds the device part, sends away (retroactively, from the start of
//     its gap) the resident allocation whose next use is farthest (ties:
//     the larger, then the read-only one), with a demand bring-back at the
//     use. This is Belady's rule, as PlanOfflineSchedule's, but with every
//     send at its earliest, so each choice frees its room for the whole
//     gap: the lower bound's LP sweep (offline_bound.cc) in whole
//     allocations. With one size and every use writing, it moves the bound
//     rounded up (the least any period-one plan can) in about 98% of
//     random steps; with sizes that vary it is a heuristic. The sweep
//     starts at the event the fewest movable bytes span, since it cannot
//     see choices across its starting cut.
//  2. Then gaps whose room is there after all (later choices freed it) stay
//     resident, the largest first: bytes before overlap.
//  3. Bring-backs move ahead of their use, the earliest use first, to the
//     earliest event within max_lead_events at which the allocation fits
//     at every event up to its use (and the in-flight cap holds). Moving a
//     bring-back earlier moves no byte more, so passes 1-2 fix the bytes
//     and pass 3 only the overlap.
//
// Pure functions and value types: no locks, no backend calls.
// Thread-compatible.
#ifndef CMA_POLICY_REPLAY_SCHEDULE_H_
#define CMA_POLICY_REPLAY_SCHEDULE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "policy/offline_schedule.h"

namespace cma {

struct ReplayPlanOptions {
  // The device's part that the step must fit in at every event (> 0).
  std::size_t device_bytes = 0;
  // A bring-back is issued at most this many events before its use (>= 1).
  std::int64_t max_lead_events = 8;
  // Bytes of bring-backs issued and not yet used, at any event; 0: no cap.
  // A bring-back issued right before its use (lead 0) never counts.
  std::size_t max_in_flight_bytes = 0;
};

struct ReplayAction {
  enum class Kind { kSendAway, kBringBack };
  Kind kind = Kind::kSendAway;
  // Issued just before the step's event with this index, in [0, events).
  std::int64_t at_event = 0;
  std::uint64_t id = 0;
  std::size_t bytes = 0;
  // kSendAway: the device holds the only valid copy of data needed later,
  // so the send costs a D2H; false: no byte needs to cross (a core that
  // cannot tell migrates anyway, correct and slower).
  bool write_back = false;
  // kBringBack: events from its issue to the use it serves (0: issued
  // right before that use, whose kernel then waits for it; counted across
  // the step's end for a use in the next step). kSendAway: 0.
  std::int64_t lead_events = 0;
};

struct ReplayPlan {
  // One step's actions, by at_event; at one event the sends first (they
  // make the room), then the bring-backs by their use, earliest first.
  std::vector<ReplayAction> actions;
  // Persistent allocations the step never uses: away for good, sent once
  // before the first replayed step; what a send leaves of them (bytes less
  // movable, all of one that cannot move, which is not listed) counts on
  // the device for the whole step.
  std::vector<std::uint64_t> host_for_good;
  // The most bytes counted on the device at any event (<= device_bytes).
  std::size_t peak_device_bytes = 0;
  // Bytes per steady-state step, as the actions sum them.
  LinkBytes bytes;
};

// The plan for `step`. kInvalidArgument naming the field for device_bytes 0
// or max_lead_events < 1; kFailedPrecondition when some event's bytes that
// cannot leave (a kernel's own, and allocations not yet used or no longer
// needed) exceed device_bytes, naming the event.
absl::StatusOr<ReplayPlan> PlanReplay(const Step& step, const ReplayPlanOptions& options);

// The least device part PlanReplay accepts for `step`: the most bytes that
// cannot leave the device at any one event (at least the largest kernel).
std::size_t MinReplayDeviceBytes(const Step& step);

}  // namespace cma

#endif  // CMA_POLICY_REPLAY_SCHEDULE_H_
