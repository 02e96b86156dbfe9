#include "policy/placement_policy.h"

namespace cma {

PlacementAction PlanAllocation(const AllocatorConfig& config, bool placed, Location current,
                               Location target) {
  if (config.prefetch != PrefetchPolicy::kOnAlloc) return PlacementAction::kNone;
  if (!placed) return PlacementAction::kPrefetch;  // fresh or unknown: populate at the target
  if (current == target) return PlacementAction::kNone;  // resident already: the cache pays twice
  return PlacementAction::kDiscardAndPrefetch;
}

PlacementAction PlanMove(bool contents_dead) {
  // Always act: kernels and the host move pages by touching them, so the
  // allocator's record of a live block can be stale; the driver skips pages
  // that are already at the target.
  return contents_dead ? PlacementAction::kDiscardAndPrefetch : PlacementAction::kPrefetch;
}

AdviceList SegmentAdvice(const AllocatorConfig& config, int device, int device_count) {
  AdviceList out;
  switch (config.preferred_location) {
    case PreferredLocationPolicy::kDevice:
      out.push_back({Advice::kSetPreferredLocation, Location::Device(device)});
      break;
    case PreferredLocationPolicy::kHost:
      out.push_back({Advice::kSetPreferredLocation, Location::Host()});
      break;
    case PreferredLocationPolicy::kNone:
      break;
  }
  if (config.accessed_by_all) {
    for (int d = 0; d < device_count; ++d) {
      out.push_back({Advice::kSetAccessedBy, Location::Device(d)});
    }
  } else {
    for (int d : config.accessed_by) out.push_back({Advice::kSetAccessedBy, Location::Device(d)});
  }
  return out;
}

AdviceList HintAdvice(const AllocationHints& hints) {
  AdviceList out;
  if (hints.read_mostly) out.push_back({Advice::kSetReadMostly, Location::Host()});
  if (hints.preferred_location) {
    out.push_back({Advice::kSetPreferredLocation, *hints.preferred_location});
  }
  for (int d : hints.accessed_by) out.push_back({Advice::kSetAccessedBy, Location::Device(d)});
  return out;
}

AdviceList WithdrawHintAdvice(const AllocationHints& hints) {
  AdviceList out;
  if (hints.read_mostly) out.push_back({Advice::kUnsetReadMostly, Location::Host()});
  if (hints.preferred_location) {
    out.push_back({Advice::kUnsetPreferredLocation, *hints.preferred_location});
  }
  for (int d : hints.accessed_by) out.push_back({Advice::kUnsetAccessedBy, Location::Device(d)});
  return out;
}

}  // namespace cma
