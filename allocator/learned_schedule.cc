#include "allocator/learned_schedule.h"

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

enum EventKind { kAllocEvent = 1, kFreeEvent = 2, kUseEvent = 3 };

// Named by a use that names nothing the step tracks, so that every
// reported use is an event of the Step as of the clock (0 bytes: it costs
// no plan anything).
constexpr std::uint64_t kNothing = kCarried;

}  // namespace

std::uint64_t LearnedSchedule::Signature(int kind, std::uint64_t value) {
  return static_cast<std::uint64_t>(kind) << 60 ^ value;
}

void LearnedSchedule::BeginStep(
    absl::Span<const std::pair<std::uintptr_t, std::size_t>> live) {
  step_ = std::make_unique<Step>();
  recording_ = true;
  overflowed_ = false;
  diverged_ = false;
  next_action_ = 0;
  alloc_pending_ = false;
  id_of_.clear();
  own_address_.clear();
  own_movable_.clear();
  signatures_.clear();
  (void)step_->Live(kNothing, 0);
  for (const auto& [addr, bytes] : live) {
    const std::uint64_t id = kCarried | addr;
    if (step_->Live(id, bytes).ok()) id_of_[addr] = id;
  }
}

void LearnedSchedule::SettleAlloc() {
  if (!alloc_pending_) return;
  alloc_pending_ = false;  // it failed: an allocation of nothing
  (void)step_->Alloc(own_address_.size() - 1, 0);
}

absl::Status LearnedSchedule::EndStep(const ReplayOptions& options, Due* due) {
  due->clear();
  if (!recording_) return absl::OkStatus();
  // A step with no event (the end marked twice) changes nothing.
  if (signatures_.empty()) return absl::OkStatus();
  SettleAlloc();
  if (replaying_ && !diverged_) {
    for (; next_action_ < plan_.actions.size(); ++next_action_) {
      const ReplayAction& a = plan_.actions[next_action_];
      if (const std::uintptr_t addr = AddressOf(a.id); addr != 0) {
        (a.kind == ReplayAction::Kind::kSendAway ? due->send : due->bring).push_back(addr);
      }
    }
  }
  recording_ = false;
  ++counts_.steps;
  // The step repeated, and so did where its allocations went (one that did
  // not fit the device before and does now is news): the plan stands.
  if (replaying_ && !diverged_ && signatures_ == planned_signatures_ &&
      own_movable_ == planned_movable_) {
    return absl::OkStatus();
  }
  replaying_ = false;
  if (overflowed_ || signatures_.empty()) return absl::OkStatus();
  absl::StatusOr<ReplayPlan> plan = PlanReplay(*step_, options);
  if (!plan.ok()) return plan.status();
  plan_ = std::move(*plan);
  planned_signatures_ = std::move(signatures_);
  planned_movable_ = own_movable_;
  signatures_.clear();
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
  return id < own_address_.size() ? own_address_[id] : 0;
}

void LearnedSchedule::Advance(std::uint64_t signature, Due* due) {
  due->clear();
  SettleAlloc();
  const std::size_t event = signatures_.size();
  if (event >= kMaxEvents) {
    overflowed_ = true;
    return;
  }
  signatures_.push_back(signature);
  if (!replaying_ || diverged_) return;
  if (event >= planned_signatures_.size() || planned_signatures_[event] != signature) {
    diverged_ = true;  // not the recorded step: this one is learnt instead
    ++counts_.divergences;
    return;
  }
  const auto& actions = plan_.actions;
  while (next_action_ < actions.size() &&
         actions[next_action_].at_event <= static_cast<std::int64_t>(event)) {
    const ReplayAction& a = actions[next_action_++];
    const std::uintptr_t addr = AddressOf(a.id);
    if (addr == 0) continue;
    (a.kind == ReplayAction::Kind::kSendAway ? due->send : due->bring).push_back(addr);
  }
}

void LearnedSchedule::Alloc(std::size_t bytes, Due* due) {
  due->clear();
  if (!recording_) return;
  Advance(Signature(kAllocEvent, bytes), due);
  if (overflowed_) return;
  own_address_.push_back(0);  // AllocDone names it
  own_movable_.push_back(false);
  alloc_pending_ = true;
}

void LearnedSchedule::AllocDone(std::uintptr_t addr, std::size_t movable_bytes) {
  if (!recording_ || !alloc_pending_) return;
  alloc_pending_ = false;
  const std::uint64_t id = own_address_.size() - 1;
  (void)step_->Alloc(id, movable_bytes);
  own_address_.back() = addr;
  own_movable_.back() = movable_bytes != 0;
  id_of_[addr] = id;
}

void LearnedSchedule::Free(std::uintptr_t addr, Due* due) {
  due->clear();
  if (!recording_) return;
  auto it = id_of_.find(addr);
  if (it == id_of_.end()) return;  // not tracked: no event
  const std::uint64_t id = it->second;
  id_of_.erase(it);
  Advance(Signature(kFreeEvent, id), due);
  if (!overflowed_) (void)step_->Free(id);
}

void LearnedSchedule::Use(absl::Span<const std::uintptr_t> addrs, std::size_t reported,
                          Due* due) {
  due->clear();
  if (!recording_ || reported == 0) return;
  // The event is the report, whatever it names: which of its allocations
  // the step tracks depends on where they went, which the plan changes.
  Advance(Signature(kUseEvent, reported), due);
  if (overflowed_) return;
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
