// DeviceAllocator's placement: carrying out policy/placement_policy.h's
// decisions through the Backend, and the zero-copy move (sleep mode is in
// sleep.cc).
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {

// Splits `r` into the kPageSize pages that lie wholly inside it (appended to
// `whole`) and the partial pages at its ends (appended to `partial`). A
// discard takes whole pages only: a partial page may hold a neighbour's data.
void SplitAtPages(const Range& r, std::vector<Range>* whole, std::vector<Range>* partial) {
  const auto lo = reinterpret_cast<std::uintptr_t>(r.ptr);
  const std::uintptr_t hi = lo + r.bytes;
  const std::uintptr_t first = (lo + kPageSize - 1) / kPageSize * kPageSize;
  const std::uintptr_t last = hi / kPageSize * kPageSize;
  if (first >= last) {  // no whole page
    partial->push_back(r);
    return;
  }
  if (lo < first) partial->push_back({r.ptr, first - lo});
  whole->push_back({reinterpret_cast<void*>(first), last - first});
  if (last < hi) partial->push_back({reinterpret_cast<void*>(last), hi - last});
}

absl::StatusOr<bool> DeviceAllocator::DiscardDead(absl::Span<const Range> ranges,
                                                  Stream stream) {
  if (learn_ != nullptr && !release_asked_) {
    for (const Range& r : ranges) stats_.kept_dead_bytes += static_cast<std::int64_t>(r.bytes);
    return false;
  }
  if (absl::Status s = backend_->DiscardBatch(ranges, stream); !s.ok()) return s;
  return true;
}

absl::Status DeviceAllocator::Execute(PlacementAction action, absl::Span<const Range> ranges,
                                      Location target, Stream stream, TransferThread* via,
                                      std::uint64_t* ticket) {
  if (action == PlacementAction::kNone || ranges.empty()) return absl::OkStatus();
  // (Dead contents are kept with learn_step:1: see DiscardDead.)
  if (action == PlacementAction::kDiscardAndPrefetch && learn_ != nullptr) {
    action = PlacementAction::kPrefetch;
  }
  absl::Status s;
  if (action == PlacementAction::kPrefetch && via != nullptr) {
    *ticket = via->Submit([backend = backend_, copy = std::vector<Range>(ranges.begin(), ranges.end()),
                           target, stream]() -> absl::Status {
      return copy.size() == 1 ? backend->Prefetch(copy[0].ptr, copy[0].bytes, target, stream)
                              : backend->PrefetchBatch(copy, target, stream);
    });
  } else if (action == PlacementAction::kPrefetch) {
    s = ranges.size() == 1 ? backend_->Prefetch(ranges[0].ptr, ranges[0].bytes, target, stream)
                           : backend_->PrefetchBatch(ranges, target, stream);
  } else {
    s = backend_->DiscardAndPrefetchBatch(ranges, target, stream);
  }
  if (!s.ok()) {
    NotePlacementError(s);
    return s;
  }
  std::int64_t bytes = 0;
  for (const Range& r : ranges) bytes += static_cast<std::int64_t>(r.bytes);
  ++stats_.prefetch_calls;
  (target.is_host() ? stats_.prefetched_bytes_to_host : stats_.prefetched_bytes_to_device) +=
      bytes;
  if (action == PlacementAction::kDiscardAndPrefetch) stats_.discarded_bytes += bytes;
  return absl::OkStatus();
}

void DeviceAllocator::ApplyAdvice(const AdviceList& advice, void* ptr, std::size_t bytes) {
  for (const auto& [a, location] : advice) {
    if (absl::Status s = backend_->Advise(ptr, bytes, a, location); s.ok()) {
      ++stats_.advise_calls;
    } else {
      NotePlacementError(std::move(s));  // advice is a hint: the memory stays valid
    }
  }
}

void DeviceAllocator::PrepareSegment(Block* whole, Stream stream) {
  ApplyAdvice(SegmentAdvice(*config_, device_, device_count_), whole->ptr(), whole->size);
  const Location target = Location::Device(device_);
  const PlacementAction a = PlanAllocation(*config_, /*placed=*/false, target, target);
  const Range r{whole->ptr(), whole->size};
  if (a != PlacementAction::kNone && Execute(a, {&r, 1}, target, stream).ok()) {
    whole->placed = true;
    whole->location = target;
  }
}

void DeviceAllocator::PlaceForAllocation(Block* b, Stream stream, const AllocationHints* hints) {
  if (ABSL_PREDICT_FALSE(b->segment->source != nullptr)) return;  // not managed memory
  const Location target = Location::Device(device_);
  if (b->segment->arena) {
    PlaceArenaBlock(b, stream, target);
  } else {
    PlaceSegmentBlock(b, stream, target);
  }
  if (ABSL_PREDICT_FALSE(hints != nullptr)) {
    ApplyAdvice(HintAdvice(*hints), b->ptr(), b->size);
    b->hints = std::make_unique<AllocationHints>(*hints);
  }
}

void DeviceAllocator::PlaceArenaBlock(Block* b, Stream stream, Location target) {
  // Pages populated by this hand-out go where the block is used; with no
  // prefetch policy the first touch populates them instead.
  if (!populate_.empty() && config_->prefetch == PrefetchPolicy::kOnAlloc) {
    (void)Execute(PlacementAction::kPrefetch, populate_, target, stream);
  }
  // Pages already populated stay where their last users put them: only a
  // block moved elsewhere (a Move to the host, say) is brought back, its
  // dead contents discarded rather than migrated.
  if (b->placed && b->location != target && config_->prefetch == PrefetchPolicy::kOnAlloc) {
    // Its edge pages may be shared with blocks in use: migrated, not discarded.
    std::vector<Range> whole, partial;
    SplitAtPages({b->ptr(), b->size}, &whole, &partial);
    (void)Execute(PlacementAction::kDiscardAndPrefetch, whole, target, stream);
    (void)Execute(PlacementAction::kPrefetch, partial, target, stream);
  }
  b->placed = config_->prefetch == PrefetchPolicy::kOnAlloc;
  b->location = target;
}

void DeviceAllocator::PlaceSegmentBlock(Block* b, Stream stream, Location target) {
  const PlacementAction a = PlanAllocation(*config_, b->placed, b->location, target);
  if (ABSL_PREDICT_FALSE(a != PlacementAction::kNone)) {
    const Range r{b->ptr(), b->size};
    b->placed = Execute(a, {&r, 1}, target, stream).ok();
    b->location = target;
  } else if (config_->prefetch != PrefetchPolicy::kOnAlloc) {
    b->placed = false;  // its user will put the pages wherever it touches them
  }
}

void DeviceAllocator::OnFreed(Block* b) {
  // A private pool keeps its blocks' contents (a graph replays into a
  // captured pool's; any pool's may be restored by a checkpoint); an
  // uncaptured pool's idle pages go as the shared cache's do, by need.
  // A host-tier block's pages stay populated on the host for its next user.
  if (!config_->discard_on_free || quiet() || b->mempool != 0 || !b->segment->placeable()) return;
  if (b->segment->arena) {
    DiscardPagesInside(b);
    return;
  }
  // Ordered on the block's stream after its last use; other streams' uses
  // have completed (their events) by the time we get here.
  const Range r{b->ptr(), b->size};
  if (absl::StatusOr<bool> d = DiscardDead({&r, 1}, b->stream); d.ok()) {
    if (*d) stats_.discarded_bytes += static_cast<std::int64_t>(b->size);
    b->placed = false;  // nothing resident to speak of: the next use populates
    // A Wake must not populate these pages again on its own stream ahead of
    // this discard, queued on the block's: whoever reuses them populates
    // them, ordered after it like any reuse of this block.
    if (ABSL_PREDICT_FALSE(!slept_edge_pages_.empty())) {
      std::vector<Range> whole, partial;
      SplitAtPages(r, &whole, &partial);
      for (const Range& w : whole) {
        const auto lo = reinterpret_cast<std::uintptr_t>(w.ptr);
        for (std::uintptr_t page = lo; page < lo + w.bytes; page += kPageSize) {
          slept_edge_pages_.erase(page);
        }
      }
    }
  } else {
    NotePlacementError(d.status());
  }
}

absl::Status DeviceAllocator::Move(absl::Span<void* const> ptrs, Location target, Stream stream,
                                   bool contents_dead) {
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("move"); !s.ok()) return s;
  DrainLearnedTransfers();
  std::vector<Block*> blocks;
  blocks.reserve(ptrs.size());
  for (void* p : ptrs) {
    auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == allocated_.end()) return NotMine();
    Block* b = it->second;
    if (ABSL_PREDICT_FALSE(b->segment->host_tier)) {
      // It lives on the host, mapped for this device: already where a move
      // to either would put it (and it must stay there: nothing counts it
      // on the device). Another device does not map it.
      if (!target.is_host() && target.device != device_) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "cma: %p lives on the host for device %d (oversubscription); device %d does not "
            "map it",
            p, device_, target.device));
      }
      continue;
    }
    if (absl::Status s = Movable(*b); !s.ok()) return s;
    blocks.push_back(b);
  }
  // A pointer named twice (tied weights in a model's tensor list) moves
  // once: each block's staged part is restored, and unstaged, once.
  {
    absl::flat_hash_set<Block*> seen;
    blocks.erase(std::remove_if(blocks.begin(), blocks.end(),
                                [&seen](Block* b) { return !seen.insert(b).second; }),
                 blocks.end());
  }
  // The move may be ordered on a stream of the owning device or of the
  // target device.
  if (absl::Status s = CheckStream(stream); !s.ok()) {
    if (target.is_host() || target.device == device_ ||
        !backend_->ValidateStream(target.device, stream).ok()) {
      return s;
    }
  }
  // An away allocation moved to its device counts there again: it needs
  // the room BringBack would (refused, changing nothing, if there is none;
  // made from idle pages otherwise). Moved to the host it stays away.
  std::vector<Block*> coming_back;
  if (target == Location::Device(device_)) {
    for (Block* b : blocks) {
      if (b->away) coming_back.push_back(b);
    }
    if (absl::Status r = CheckRoomToBringBack(coming_back); !r.ok()) return r;
  }
  // Contents a Sleep staged come back first (copied into their pages at
  // the target), or are forgotten if the caller declares them dead.
  if (ABSL_PREDICT_FALSE(!staged_.empty())) {
    if (absl::Status r = RestoreStaged(blocks, target, stream, contents_dead); !r.ok()) {
      return absl::Status(r.code(), absl::StrCat("cma: move could not restore what the sleep "
                                                 "staged: ", r.message()));
    }
  }
  // Pages a Sleep discarded are populated again (on the device, or on the
  // host, where the caller may then write them) only after that discard.
  for (Block* b : blocks) {
    if (!b->pages_discarded) continue;
    if (absl::Status w = OrderAfter(stream, sleep_wake_stream_); !w.ok()) {
      return absl::Status(w.code(), absl::StrCat("cma: move could not order after the sleep: ",
                                                 w.message()));
    }
    break;
  }
  // One batch per action, so a whole model's tensors move in one or two calls.
  std::vector<Range> prefetch, discard_prefetch;
  for (Block* b : blocks) {
    switch (PlanMove(contents_dead)) {
      case PlacementAction::kNone: break;
      case PlacementAction::kPrefetch: prefetch.push_back({b->ptr(), b->size}); break;
      case PlacementAction::kDiscardAndPrefetch:
        // Dead contents are discarded by whole pages; partial edge pages
        // may hold a neighbour's live data and migrate instead.
        SplitAtPages({b->ptr(), b->size}, &discard_prefetch, &prefetch);
        break;
    }
  }
  absl::Status s = Execute(PlacementAction::kPrefetch, prefetch, target, stream);
  if (s.ok()) s = Execute(PlacementAction::kDiscardAndPrefetch, discard_prefetch, target, stream);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cma: move to ", LocationName(target),
                                               " failed: ", s.message()));
  }
  if (!coming_back.empty()) {
    MakeRoomToBringBack(InnerPageCount(coming_back), stream);
    for (Block* b : coming_back) CountBack(b);
  }
  for (Block* b : blocks) {
    b->placed = true;
    b->location = target;
    // What the caller writes at the target from now on is live: a Wake
    // migrates it. (Moved to the host, the pages are still none of the
    // device's: the free tells the page map so.)
    b->sleep_dropped = false;
    if (!target.is_host()) {
      b->pages_discarded = false;
      b->discarded_from = 0;
    }
  }
  stats_.moves += static_cast<std::int64_t>(blocks.size());
  return absl::OkStatus();
}

absl::Status DeviceAllocator::Movable(const Block& b) {
  if (ABSL_PREDICT_TRUE(b.segment->source == nullptr)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "cma: %p is memory of a pool's own allocator, not managed memory: it cannot move",
      b.ptr()));
}

absl::Status DeviceAllocator::CheckMovable(absl::Span<void* const> ptrs) {
  MutexLock l(&mu_);
  for (void* p : ptrs) {
    auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == allocated_.end()) return NotMine();
    if (absl::Status s = Movable(*it->second); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DeviceAllocator::SetDisposable(void* ptr, bool disposable) {
  MutexLock l(&mu_);
  auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocated_.end()) return NotMine();
  it->second->disposable = disposable;
  return absl::OkStatus();
}

absl::Status DeviceAllocator::SetHints(void* ptr, const AllocationHints& hints) {
  for (int d : hints.accessed_by) {
    if (d < 0 || d >= device_count_) {
      return absl::InvalidArgumentError(absl::StrFormat("cma: accessed_by names device %d", d));
    }
  }
  MutexLock l(&mu_);
  auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocated_.end()) return NotMine();
  if (absl::Status s = RefuseWhileQuiet("set_hints"); !s.ok()) return s;
  Block* b = it->second;
  if (b->segment->host_tier) {
    return absl::FailedPreconditionError(
        "cma: the allocation lives on the host (oversubscription): its placement is the host "
        "tier's, which advice would undo");
  }
  if (b->segment->source != nullptr) {
    return absl::FailedPreconditionError(
        "cma: the allocation is memory of a pool's own allocator, not managed memory: advice "
        "does not apply to it");
  }
  if (b->hints) ApplyAdvice(WithdrawHintAdvice(*b->hints), b->ptr(), b->size);
  ApplyAdvice(HintAdvice(hints), b->ptr(), b->size);
  b->hints = std::make_unique<AllocationHints>(hints);
  return absl::OkStatus();
}

}  // namespace cma
