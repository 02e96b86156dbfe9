// The host plan's record of one iteration (config host_plan:1,
// allocator/iteration_plan.cc): what DeviceAllocator keeps between two
// MarkIteration calls. Internal to allocator/; guarded by its mutex.
#ifndef CMA_ALLOCATOR_ITERATION_PLAN_H_
#define CMA_ALLOCATOR_ITERATION_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "policy/host_plan.h"

namespace cma {

struct IterationRecord {
  // The iteration being recorded: its own allocations and the device
  // allocations it began with, in event time, with where each live one is
  // recorded (own?, index).
  bool recording = false;
  std::int64_t time = 0;
  std::vector<Lifetime> own;
  std::vector<std::size_t> own_sizes;  // the requests, rounded
  std::vector<Lifetime> carried;
  absl::flat_hash_map<std::uintptr_t, std::pair<bool, std::size_t>> index;
  // The plan from the iteration before: per allocation, its size and
  // whether it lives on the host. Empty when there is none or it ended.
  std::vector<std::size_t> plan_sizes;
  std::vector<bool> plan_host;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_ITERATION_PLAN_H_
