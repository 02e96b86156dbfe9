// DeviceAllocator's learned step (config learn_step:1): the events go to
// LearnedSchedule (allocator/learned_schedule.h), which records the step
// and says what its plan has due before each event; this carries it out.
//
// Ordering, all on the GPU: a send away waits for the streams of the
// allocation's last reported use and its own (an event each), then runs on
// the away stream; a bring back waits for the allocation's send, runs on
// the back stream, and the stream of the allocation's next reported use
// waits for it. Both directions of the link and the step's kernels run at
// once. A bring back the budget has no room for is skipped (counted in
// learned_misses): the kernel that uses the allocation then migrates its
// pages on demand, correct and slower.
#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

// The device part the plan may fill: the budget less room for what the
// plan does not see (the pages that allocations share at their edges,
// allocations it does not track).
std::size_t PlannedPart(std::size_t budget) { return budget - budget / 16; }

// How far ahead of its use a bring back may start, in events.
constexpr std::int64_t kMaxLeadEvents = 512;

// Forgets a bring back's fetch event, kept for reuse once its record has
// been made (with a transfer thread, it may still be queued there).
void DropFetch(LearnState& ls, absl::flat_hash_map<std::uintptr_t, LearnState::Fetch>::iterator f,
               std::vector<Event>& spare) {
  if (ls.mover != nullptr) ls.mover->WaitIssued(f->second.ticket);
  spare.push_back(f->second.event);
  ls.fetches.erase(f);
}

}  // namespace

absl::Status DeviceAllocator::NoteUses(absl::Span<void* const> ptrs, Stream stream) {
  MutexLock l(&mu_);
  if (learn_ == nullptr) {
    return absl::FailedPreconditionError(
        "cma: uses are reported only with learn_step:1 in the config");
  }
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  if (quiet()) return absl::OkStatus();  // a capture: no call may be made
  std::vector<std::uintptr_t> addrs;
  addrs.reserve(ptrs.size());
  for (void* p : ptrs) {
    auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == allocated_.end()) continue;  // not an allocation of this device
    addrs.push_back(it->first);
  }
  learn_->schedule.Use(addrs, ptrs.size(), &learn_->due);
  RunDue();
  for (std::uintptr_t a : addrs) {
    Block* b = allocated_.at(a);
    b->used_on = stream;
    auto f = learn_->fetches.find(a);
    if (f == learn_->fetches.end()) continue;
    // (With a transfer thread, its event is recorded once the call is made:
    // usually long before the use, the plan's lead.)
    if (learn_->mover != nullptr) learn_->mover->WaitIssued(f->second.ticket);
    if (absl::Status w = backend_->StreamWaitEvent(stream, f->second.event); !w.ok()) {
      NotePlacementError(std::move(w));
    }
    DropFetch(*learn_, f, spare_events_);
  }
  return absl::OkStatus();
}

void DeviceAllocator::LearnBeforeAlloc(std::size_t rounded) {
  learn_->schedule.Alloc(rounded, &learn_->due);
  RunDue();
}

void DeviceAllocator::LearnFree(Block* b) {
  learn_->schedule.Free(b->addr, &learn_->due);
  RunDue();
  if (auto f = learn_->fetches.find(b->addr); f != learn_->fetches.end()) {
    // Its transfer is one of the free's stream uses, recorded after it.
    DropFetch(*learn_, f, spare_events_);
  }
}

void DeviceAllocator::DrainLearnedTransfers() {
  if (learn_ != nullptr && learn_->mover != nullptr) learn_->mover->Drain();
}

void DeviceAllocator::CollectLearnedTransferFailures() {
  LearnState& ls = *learn_;
  if (ls.mover == nullptr || !ls.mover->HasFailures()) return;
  absl::Status last;
  const std::vector<std::uint64_t> failed = ls.mover->TakeFailures(&last);
  std::int64_t undone = 0;
  for (std::uint64_t ticket : failed) {
    auto call = ls.bring_calls.find(ticket);
    if (call == ls.bring_calls.end()) continue;  // a fetch event's record
    for (std::uintptr_t a : call->second) {
      auto it = allocated_.find(a);
      auto f = ls.fetches.find(a);
      // Freed, sent again, or used since (the use's kernel migrated its
      // pages on demand): as counted now.
      if (it == allocated_.end() || it->second->away || f == ls.fetches.end()) continue;
      Block* b = it->second;
      Block* one[] = {b};
      const auto pages = static_cast<std::int64_t>(InnerPageCount(one));
      CountAway(b);
      stats_.brought_back_bytes -= pages * static_cast<std::int64_t>(kPageSize);
      stats_.num_pages_populated -= pages;
      DropFetch(ls, f, spare_events_);
      ++ls.misses;
      ++undone;
    }
    ls.bring_calls.erase(call);
  }
  NotePlacementError(absl::Status(
      last.code(), absl::StrFormat("cma: %d learned transfer call(s) failed (%d allocations left "
                                   "away), the last: %s",
                                   failed.size(), undone, last.message())));
}

void DeviceAllocator::RunDue() {
  LearnState& ls = *learn_;
  CollectLearnedTransferFailures();
  if (ls.due.empty()) return;
  if (!ls.streams) {
    absl::StatusOr<Stream> away = backend_->CreateStream(device_);
    absl::StatusOr<Stream> back = away.ok() ? backend_->CreateStream(device_) : away;
    if (!away.ok() || !back.ok()) {
      if (away.ok()) (void)backend_->DestroyStream(*away);
      NotePlacementError(away.ok() ? back.status() : away.status());
      ls.due.clear();
      return;
    }
    ls.away_stream = *away;
    ls.back_stream = *back;
    if (config_->learn_transfer_thread) ls.mover = std::make_unique<TransferThread>();
    known_streams_.insert(*away);
    known_streams_.insert(*back);
    ls.streams = true;
  }
  auto blocks_of = [&](const std::vector<std::uintptr_t>& addrs, bool away) {
    std::vector<Block*> out;
    for (std::uintptr_t a : addrs) {
      auto it = allocated_.find(a);
      if (it == allocated_.end()) continue;
      Block* b = it->second;
      if (b->away == away || !CanBeAway(*b)) continue;
      out.push_back(b);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  };
  auto host_us = [](absl::Time since) { return absl::ToInt64Microseconds(absl::Now() - since); };
  if (std::vector<Block*> send = blocks_of(ls.due.send, true); !send.empty()) {
    const absl::Time t0 = absl::Now();
    // After the kernels that last used them.
    absl::flat_hash_set<Stream> users;
    for (const Block* b : send) {
      users.insert(b->stream);
      users.insert(b->used_on);
    }
    // And after a bring back not yet followed by a use (its transfer's
    // call made first, with a transfer thread).
    for (const Block* b : send) {
      auto f = ls.fetches.find(b->addr);
      if (f == ls.fetches.end()) continue;
      if (ls.mover != nullptr) ls.mover->WaitIssued(f->second.ticket);
      users.insert(ls.back_stream);
    }
    for (Stream u : users) {
      if (absl::Status w = OrderAfter(ls.away_stream, u); !w.ok()) NotePlacementError(w);
    }
    if (absl::Status s = MoveAway(send, true, ls.away_stream); !s.ok()) NotePlacementError(s);
    ls.send_host_us += host_us(t0);
  }
  if (std::vector<Block*> bring = blocks_of(ls.due.bring, false); !bring.empty()) {
    const absl::Time t0 = absl::Now();
    // After their sends (a prefetch that overtook its send would leave the
    // data on the host); their users' kernels came before the sends.
    if (absl::Status w = OrderAfter(ls.back_stream, ls.away_stream); !w.ok()) {
      NotePlacementError(w);
    }
    // One transfer call for all that fit (fewer driver calls; on the H200
    // their host time stayed what the bytes cost, hence the transfer thread).
    std::vector<Block*> fits;
    for (Block* b : bring) {
      fits.push_back(b);
      if (!CheckRoomToBringBack(fits).ok()) {
        fits.pop_back();
        ++ls.misses;
      }
    }
    if (!fits.empty() && !MoveAway(fits, false, ls.back_stream).ok()) {
      ls.misses += static_cast<std::int64_t>(fits.size());
      fits.clear();
    }
    for (Block* b : fits) {
      absl::StatusOr<Event> ev = TakeEvent();
      LearnState::Fetch fetch;
      if (ev.ok() && ls.mover != nullptr) {
        fetch = {*ev, ls.mover->Submit([backend = backend_, e = *ev, s = ls.back_stream] {
                   return backend->RecordEvent(e, s);
                 })};
      } else if (ev.ok() && backend_->RecordEvent(*ev, ls.back_stream).ok()) {
        fetch = {*ev, 0};
      } else {
        if (ev.ok()) spare_events_.push_back(*ev);
        // No event to order its use after: its transfer's call is made now.
        DrainLearnedTransfers();
        break;
      }
      auto [it, fresh] = ls.fetches.try_emplace(b->addr, fetch);
      if (!fresh) {
        if (ls.mover != nullptr) ls.mover->WaitIssued(it->second.ticket);
        spare_events_.push_back(it->second.event);
        it->second = fetch;
      }
    }
    ls.bring_host_us += host_us(t0);
  }
  ls.due.clear();
}

LearnedSchedule::Extent DeviceAllocator::LearnedExtent(const Block& b, bool carried) {
  // On the host tier for good: routed there, or carried (never made again,
  // and a host-tier block cannot be brought back).
  if (b.routed_to_host || (carried && b.segment->host_tier)) return {0, 0};
  // The device counts whole pages, and a send leaves the first and last.
  if (carried) {  // at its address for good: what it spans there
    const std::size_t first = b.segment->PageOf(b.addr);
    const std::size_t last = b.segment->PageOf(b.addr + b.size - 1);
    Block* one[] = {const_cast<Block*>(&b)};
    return {(last - first + 1) * kPageSize, CanBeAway(b) ? InnerPageCount(one) * kPageSize : 0};
  }
  // Made in the step: where it lands changes from step to step, so what it
  // counts is fixed by its size (a plan that changed with its alignment
  // would be made every step): its bytes (pages it shares with neighbours
  // are the planned part's margin), and the least a send moves. One on the
  // host tier (the device was full) lands in an arena next time.
  const bool movable = b.segment->host_tier || Awayable(b).ok();
  return {b.size, movable && b.size > 2 * kPageSize ? b.size - 2 * kPageSize : 0};
}

void DeviceAllocator::EndLearnedStep() {
  LearnState& ls = *learn_;
  DrainLearnedTransfers();
  CollectLearnedTransferFailures();
  ls.bring_calls.clear();
  ReplayPlanOptions options;
  options.device_bytes = PlannedPart(budget_);
  options.max_lead_events = kMaxLeadEvents;
  if (absl::Status s = ls.schedule.EndStep(options, &ls.due); !s.ok()) NotePlacementError(s);
  RunDue();
  std::vector<std::pair<std::uintptr_t, LearnedSchedule::Extent>> live;
  for (const auto& [addr, b] : allocated_) {
    if (b->mempool == 0) live.push_back({addr, LearnedExtent(*b, /*carried=*/true)});
  }
  std::sort(live.begin(), live.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });
  ls.schedule.BeginStep(live);
}

}  // namespace cma
