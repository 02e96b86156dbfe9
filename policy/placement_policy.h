// Where managed memory should be, decided from what the allocator knows of a
// block: where it was last placed and where it is wanted next.
//
// Pure functions and value types: no locks, no backend calls. The allocator
// carries the decisions out through the Backend.
#ifndef CMA_POLICY_PLACEMENT_POLICY_H_
#define CMA_POLICY_PLACEMENT_POLICY_H_

#include <optional>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "policy/config.h"

namespace cma {

// Per-allocation advice. Applied to the block when it is handed out and
// withdrawn when it is freed, so the next user of the memory inherits none.
struct AllocationHints {
  bool read_mostly = false;
  std::optional<Location> preferred_location;
  std::vector<int> accessed_by;
};

enum class PlacementAction {
  kNone,                // already where it is wanted, or the policy says leave it
  kPrefetch,            // migrate (or populate) to the target
  kDiscardAndPrefetch,  // the contents are dead: populate at the target, migrate nothing
};

// For a block being handed out for use on `target`. A reused block's old
// contents are dead by definition (fresh memory has no defined value), so a
// block last placed elsewhere is discarded rather than migrated. `placed`
// and `current` are trusted only because, under prefetch:on_alloc, every
// block handed out is placed on its allocating device, where its user runs.
PlacementAction PlanAllocation(const AllocatorConfig& config, bool placed, Location current,
                               Location target);

// For an explicit move of live data (`contents_dead` when the caller will
// overwrite it all). Never kNone: see the definition.
PlacementAction PlanMove(bool contents_dead);

using AdviceList = std::vector<std::pair<Advice, Location>>;

// Advice for every new segment of `device` from the config
// (preferred_location, accessed_by).
AdviceList SegmentAdvice(const AllocatorConfig& config, int device, int device_count);
// Advice that carries out `hints`, and the advice that withdraws it.
AdviceList HintAdvice(const AllocationHints& hints);
AdviceList WithdrawHintAdvice(const AllocationHints& hints);

}  // namespace cma

#endif  // CMA_POLICY_PLACEMENT_POLICY_H_
