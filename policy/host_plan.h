// Oversubscription's plan for a repeating workload (training steps): which
// allocations of the next iteration live on the host, learnt from the last
// one (allocator/host_tier.cc records it; policy/oversubscription.h says why
// the host at all).
//
// Allocation order alone places on the host whatever arrives once the device
// is full: in a training step that is every short-lived temporary of the
// backward pass, each crossing the link several times, while the long-lived
// activations that filled the device stay. The plan instead keeps the
// device's live bytes under its capacity at every moment by placing on the
// host, whenever they would exceed it, the live allocation freed last
// (Belady's rule over lifetimes): the fewest bytes that hold the device
// longest, so the fewest bytes cross the link.
//
// Pure functions: no locks, no backend calls.
#ifndef CMA_POLICY_HOST_PLAN_H_
#define CMA_POLICY_HOST_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/types/span.h"

namespace cma {

// One allocation of a recorded iteration, in the iteration's event time
// (allocations and frees counted from 0). `end` is kNeverFreed for one still
// live when the iteration ended.
struct Lifetime {
  static constexpr std::int64_t kNeverFreed = std::numeric_limits<std::int64_t>::max();
  std::size_t bytes = 0;
  std::int64_t start = 0;
  std::int64_t end = kNeverFreed;
};

// For each of `own` (the iteration's allocations, in allocation order),
// whether it goes to the host. `carried` are device allocations made before
// the iteration (start 0): fixed where they are, they count against
// `capacity` until their end. Where even the fixed ones exceed the capacity,
// every choosable live allocation goes to the host.
std::vector<bool> PlanHostPlacement(absl::Span<const Lifetime> own,
                                    absl::Span<const Lifetime> carried, std::size_t capacity);

}  // namespace cma

#endif  // CMA_POLICY_HOST_PLAN_H_
