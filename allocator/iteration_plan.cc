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
  if (host_budget_ == 0 || !config_->host_plan) return;
  plan_host_.clear();
  plan_sizes_.clear();
  if (recording_ && !recorded_.empty()) {
    // Room for the pages that allocations share at their edges.
    const std::size_t capacity = budget_ - budget_ / 16;
    plan_host_ = PlanHostPlacement(recorded_, carried_, capacity);
    plan_sizes_ = std::move(recorded_sizes_);
  }
  recorded_.clear();
  recorded_sizes_.clear();
  carried_.clear();
  record_index_.clear();
  record_time_ = 0;
  recording_ = true;
  // The device allocations this iteration begins with (the host's hold no
  // device memory: they are none of the plan's concern).
  for (const auto& [addr, b] : allocated_) {
    if (b->segment->host_tier) continue;
    record_index_[addr] = {false, carried_.size()};
    carried_.push_back({b->size, 0, Lifetime::kNeverFreed});
  }
}

bool DeviceAllocator::PlannedOnHost(std::size_t rounded) {
  const std::size_t next = recorded_.size();
  if (!recording_ || next >= plan_sizes_.size() || plan_sizes_[next] != rounded) {
    plan_host_.clear();  // not the recorded iteration: the plan ends here
    plan_sizes_.clear();
    return false;
  }
  return plan_host_[next];
}

void DeviceAllocator::RecordAllocation(const Block* b) {
  if (recorded_.size() >= kMaxRecorded) {
    recording_ = false;
    return;
  }
  record_index_[b->addr] = {true, recorded_.size()};
  recorded_sizes_.push_back(RoundRequest(b->requested, *config_));
  recorded_.push_back({b->size, record_time_++,
                       Lifetime::kNeverFreed});
}

void DeviceAllocator::RecordFree(std::uintptr_t addr) {
  auto it = record_index_.find(addr);
  if (it == record_index_.end()) return;  // made before, on the host
  const auto [own, index] = it->second;
  (own ? recorded_ : carried_)[index].end = record_time_++;
  record_index_.erase(it);
}

}  // namespace cma
