// DeviceAllocator's iteration plan (oversubscription): each iteration of a
// repeating workload is recorded (its allocations and frees, in event time,
// and the device allocations it began with), and at its end becomes the plan
// of the next: policy/host_plan.h decides which allocations live on the
// host. The next iteration follows the plan while its requests are the
// recorded ones, size for size; the first that differs ends the plan, and
// allocation order decides for the rest (policy/oversubscription.h).
#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

// A workload that never ends an iteration is not recorded forever.
constexpr std::size_t kMaxRecorded = std::size_t{1} << 20;

}  // namespace

void DeviceAllocator::MarkIteration() {
  MutexLock l(&mu_);
  if (learn_ != nullptr && !quiet()) EndLearnedStep();
  if (!config_->host_plan) return;
  // A mark before the device's first allocation (a loop marking each step
  // from step 0) plans the budget: recording starts now, as it did when the
  // budget was planned at Create.
  if (config_->oversubscribe && !PlanBudget().ok()) return;
  if (host_budget_ == 0) return;
  iteration_.plan_host.clear();
  iteration_.plan_sizes.clear();
  if (iteration_.recording && !iteration_.own.empty()) {
    // Room for the pages that allocations share at their edges.
    const std::size_t capacity = budget_ - budget_ / 16;
    iteration_.plan_host = PlanHostPlacement(iteration_.own, iteration_.carried, capacity);
    iteration_.plan_sizes = std::move(iteration_.own_sizes);
  }
  iteration_.own.clear();
  iteration_.own_sizes.clear();
  iteration_.carried.clear();
  iteration_.index.clear();
  iteration_.time = 0;
  iteration_.recording = true;
  // The device allocations this iteration begins with (the host's hold no
  // device memory: they are none of the plan's concern).
  for (const auto& [addr, b] : allocated_) {
    if (b->segment->host_tier) continue;
    iteration_.index[addr] = {false, iteration_.carried.size()};
    iteration_.carried.push_back({b->size, 0, Lifetime::kNeverFreed});
  }
}

bool DeviceAllocator::PlannedOnHost(std::size_t rounded) {
  const std::size_t next = iteration_.own.size();
  if (!iteration_.recording || next >= iteration_.plan_sizes.size() || iteration_.plan_sizes[next] != rounded) {
    iteration_.plan_host.clear();  // not the recorded iteration: the plan ends here
    iteration_.plan_sizes.clear();
    return false;
  }
  return iteration_.plan_host[next];
}

void DeviceAllocator::RecordAllocation(const Block* b) {
  if (iteration_.own.size() >= kMaxRecorded) {
    iteration_.recording = false;
    return;
  }
  iteration_.index[b->addr] = {true, iteration_.own.size()};
  iteration_.own_sizes.push_back(RoundRequest(b->requested, *config_));
  iteration_.own.push_back({b->size, iteration_.time++,
                       Lifetime::kNeverFreed});
}

void DeviceAllocator::RecordFree(std::uintptr_t addr) {
  auto it = iteration_.index.find(addr);
  if (it == iteration_.index.end()) return;  // made before, on the host
  const auto [own, index] = it->second;
  (own ? iteration_.own : iteration_.carried)[index].end = iteration_.time++;
  iteration_.index.erase(it);
}

}  // namespace cma
