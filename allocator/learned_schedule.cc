#include "allocator/learned_schedule.h"

#include <algorithm>
#include <utility>

namespace cma {
namespace {

// Ids: an allocation made in the step is its ordinal there (the same in
// every repeat of the step); one carried through it, its address with the
// top bit set (the same while it lives, which is what a carried parameter
// or optimizer state does).
constexpr std::uint64_t kCarried = std::uint64_t{1} << 63;
// A step that never ends is not recorded forever.
constexpr std::size_t kMaxEvents = std::size_t{1} << 21;
// Named by a use that names nothing the step tracks, so that every
// reported use is an event of the Step (0 bytes: it costs no plan anything).
constexpr std::uint64_t kNothing = kCarried;

}  // namespace

void LearnedSchedule::BeginStep(absl::Span<const std::pair<std::uintptr_t, Extent>> live) {
  step_ = std::make_unique<Step>();
  recording_ = true;
  overflowed_ = false;
  diverged_ = false;
  next_action_ = 0;
  alloc_pending_ = false;
  events_ = 0;
  id_of_.clear();
  own_address_.clear();
  own_sizes_.clear();
  own_device_.clear();
  uses_.clear();
  (void)step_->Live(kNothing, 0);
  for (const auto& [addr, extent] : live) {
    const std::uint64_t id = kCarried | addr;
    if (step_->Live(id, extent.device_bytes, extent.movable_bytes).ok()) id_of_[addr] = id;
  }
}

void LearnedSchedule::SettleAlloc() {
  if (!alloc_pending_) return;
  alloc_pending_ = false;  // it failed: an allocation of nothing
  (void)step_->Alloc(own_address_.size() - 1, 0);
}

bool LearnedSchedule::Record() {
  SettleAlloc();
  if (events_ >= kMaxEvents) overflowed_ = true;
  if (overflowed_) return false;
  ++events_;
  return true;
}

void LearnedSchedule::Collect(std::size_t use, Due* due) {
  const auto& actions = plan_.actions;
  while (next_action_ < actions.size() && action_use_[next_action_] <= use) {
    const ReplayAction& a = actions[next_action_++];
    const std::uintptr_t addr = AddressOf(a.id);
    if (addr == 0) continue;
    (a.kind == ReplayAction::Kind::kSendAway ? due->send : due->bring).push_back(addr);
  }
}

absl::Status LearnedSchedule::EndStep(const ReplayPlanOptions& options, Due* due) {
  due->clear();
  if (!recording_) return absl::OkStatus();
  // A step with no event (the end marked twice) changes nothing.
  if (events_ == 0) return absl::OkStatus();
  SettleAlloc();
  if (replaying_ && !diverged_) Collect(~std::size_t{0}, due);  // what is due at the end
  recording_ = false;
  ++counts_.steps;
  // The step repeated, and so did its allocations and what they hold on the
  // device: the plan stands.
  if (replaying_ && !diverged_ && uses_ == planned_uses_ && own_sizes_ == planned_sizes_ &&
      own_device_ == planned_device_) {
    return absl::OkStatus();
  }
  replaying_ = false;
  if (overflowed_) return absl::OkStatus();
  absl::StatusOr<ReplayPlan> plan = PlanReplay(*step_, options);
  if (!plan.ok()) return plan.status();
  plan_ = std::move(*plan);
  // Each action's place on the clock: the number of uses before its event.
  std::vector<std::size_t> uses_before(step_->events().size() + 1, 0);
  for (std::size_t e = 0; e < step_->events().size(); ++e) {
    uses_before[e + 1] = uses_before[e] + (step_->events()[e].kind == Step::Kind::kUse);
  }
  action_use_.clear();
  for (const ReplayAction& a : plan_.actions) {
    const auto e = static_cast<std::size_t>(std::max<std::int64_t>(0, a.at_event));
    action_use_.push_back(uses_before[std::min(e, uses_before.size() - 1)]);
  }
  planned_uses_ = uses_;
  planned_sizes_ = own_sizes_;
  planned_device_ = own_device_;
  replaying_ = true;
  ++counts_.plans;
  // What the step never uses leaves once, before the replay begins.
  for (std::uint64_t id : plan_.host_for_good) {
    if ((id & kCarried) && id != kNothing) {
      due->send.push_back(static_cast<std::uintptr_t>(id & ~kCarried));
    }
  }
  return absl::OkStatus();
}

std::uintptr_t LearnedSchedule::AddressOf(std::uint64_t id) const {
  if (id & kCarried) return static_cast<std::uintptr_t>(id & ~kCarried);
  // The same ordinal of a request of the same size, or nothing: what else
  // allocates in the step (an offload that adapts) may shift the ordinals.
  if (id >= own_address_.size() || id >= planned_sizes_.size() ||
      own_sizes_[id] != planned_sizes_[id]) {
    return 0;
  }
  return own_address_[id];
}

void LearnedSchedule::Alloc(std::size_t bytes, Due* due) {
  due->clear();
  if (!recording_ || !Record()) return;
  own_address_.push_back(0);  // AllocDone names it
  own_sizes_.push_back(bytes);
  own_device_.push_back(0);
  alloc_pending_ = true;
}

void LearnedSchedule::AllocDone(std::uintptr_t addr, Extent extent) {
  if (!recording_ || !alloc_pending_) return;
  alloc_pending_ = false;
  const std::uint64_t id = own_address_.size() - 1;
  // Where it went must not change what it counts: the request, rounded
  // (a host-tier block is whole pages, or a larger cached one).
  if (extent.device_bytes > own_sizes_.back()) {
    extent.movable_bytes -= std::min(extent.movable_bytes, extent.device_bytes - own_sizes_.back());
    extent.device_bytes = own_sizes_.back();
  }
  (void)step_->Alloc(id, extent.device_bytes, extent.movable_bytes);
  own_device_.back() = extent.device_bytes;
  own_address_.back() = addr;
  id_of_[addr] = id;
}

void LearnedSchedule::Free(std::uintptr_t addr, Due* due) {
  due->clear();
  if (!recording_) return;
  auto it = id_of_.find(addr);
  if (it == id_of_.end()) return;  // not known to the step: no event
  const std::uint64_t id = it->second;
  id_of_.erase(it);
  if (Record()) (void)step_->Free(id);
}

void LearnedSchedule::Use(absl::Span<const std::uintptr_t> addrs, std::size_t reported,
                          Due* due) {
  due->clear();
  if (!recording_ || reported == 0 || !Record()) return;
  // The replay's clock is the reported uses alone: the framework's order of
  // modules and parameters, which no placement, offload or allocation
  // changes. A use reporting another number of pointers than the recorded
  // one ends the replay.
  const std::size_t use = uses_.size();
  uses_.push_back(reported);
  if (replaying_ && !diverged_) {
    if (use >= planned_uses_.size() || planned_uses_[use] != reported) {
      diverged_ = true;  // not the recorded step: this one is learnt instead
      ++counts_.divergences;
    } else {
      Collect(use, due);
    }
  }
  std::vector<StepAccess> accesses;
  accesses.reserve(addrs.size() + 1);
  for (std::uintptr_t a : addrs) {
    auto it = id_of_.find(a);
    if (it != id_of_.end()) accesses.push_back({it->second, AccessMode::kReadWrite});
  }
  if (accesses.empty()) accesses.push_back({kNothing, AccessMode::kRead});
  (void)step_->Use(accesses);
}

}  // namespace cma
