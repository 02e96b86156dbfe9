// DeviceAllocator's private pools (allocator/mempool.h): PyTorch's MemPool
// and CUDA graph pools, in the allocator core so that every framework gets
// the same semantics and the host backend tests them.
//
// A pool's blocks lie in segments of its own and belong to it for good:
// freed, a block waits in the pool (keyed by the pool first in the
// free-block order, so it serves and merges with no one else). Released and
// empty, the pool drains: its segments serve no one and are given back
// only when cached memory is, after a wait for the device (never at the
// release itself, as in PyTorch): a graph may still be replaying into them.
// While any pool context that may be a capture is open, a CUDA graph capture
// may be under way on some stream, so the allocator is quiet: no query,
// event, sync, placement or discard call (PyTorch's allocator likewise stops
// processing events while captures are under way). Frees that need events
// wait in deferred_ until the last such context ends. A context its caller
// knows is no capture (PyTorch's use_mem_pool) routes without quieting, and
// a pool only such contexts allocate to grows, in arena mode, by arenas of
// its own whose idle pages are given back as the shared cache's are: the
// footprint the shared cache has (a pool of native-size segments held 50%
// more on a varlen training loop).
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {

std::uint32_t DeviceAllocator::PoolIndex(MemPoolId id) {
  auto [it, fresh] = mempool_index_.try_emplace(id, next_mempool_);
  if (fresh) {
    mempools_[next_mempool_].id = id;
    ++next_mempool_;
  }
  return it->second;
}

void DeviceAllocator::CreateOrIncrefPool(MemPoolId id) {
  MutexLock l(&mu_);
  ++mempools_[PoolIndex(id)].use_count;
}

absl::Status DeviceAllocator::CreatePoolWithSource(MemPoolId id,
                                                   std::shared_ptr<SegmentSource> source) {
  if (source == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: pool (%d, %d) of device %d: no segment source given", id.first, id.second, device_));
  }
  MutexLock l(&mu_);
  if (auto known = mempool_index_.find(id); known != mempool_index_.end()) {
    const bool draining = mempools_[known->second].use_count == 0;
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: pool (%d, %d) of device %d exists already%s; it cannot be given another allocator",
        id.first, id.second, device_,
        draining ? " (released, its segments go back at the next empty_cache)" : ""));
  }
  PrivatePool& pool = mempools_[PoolIndex(id)];
  pool.use_count = 1;
  pool.source = std::move(source);
  return absl::OkStatus();
}

bool DeviceAllocator::AllocatingToPool() {
  MutexLock l(&mu_);
  return quiet();
}

void DeviceAllocator::BeginAllocateToPool(MemPoolId id, StreamFilter filter,
                                          PoolContextOptions options) {
  MutexLock l(&mu_);
  // As PyTorch's: the pool is created, or its use count raised, here too.
  const std::uint32_t index = PoolIndex(id);
  PrivatePool& pool = mempools_[index];
  ++pool.use_count;
  // A captured pool's contexts are all taken as captures: a capture may be
  // resumed into it under a thread's context (a capture broken into
  // segments re-enters the pool before its next segment begins).
  if (pool.captured) options.not_a_capture = false;
  if (!options.not_a_capture) {
    // No call of the learned step's transfer thread may come after the
    // capture begins.
    DrainLearnedTransfers();
    if (!pool.captured) PinPoolArenas(index);
    pool.captured = true;
    ++capture_contexts_;
  }
  contexts_.push_back({index, std::move(filter), options});
}

void DeviceAllocator::PinPoolArenas(std::uint32_t index) {
  for (auto& [base, seg] : segments_) {
    if (!seg->arena || seg->owner_pool != index || seg->pinned) continue;
    seg->pinned = true;
    std::size_t idle = 0;
    (void)CheckArenaPages(seg, &idle);  // the recount of its idle pages
    pinned_idle_pages_ += idle;
  }
}

bool DeviceAllocator::PoolPagesPinned(std::uint32_t index) const {
  if (index == 0) return false;
  auto it = mempools_.find(index);
  return it == mempools_.end() || it->second.captured;
}

bool DeviceAllocator::PoolGrowsByArenas(std::uint32_t index) const {
  if (index == 0 || !arena_mode()) return false;
  auto it = mempools_.find(index);
  return it != mempools_.end() && !it->second.captured && it->second.source == nullptr &&
         !it->second.no_split;
}

bool DeviceAllocator::NoSplit(std::uint32_t mempool) const {
  if (ABSL_PREDICT_TRUE(mempool == 0)) return false;
  auto it = mempools_.find(mempool);
  return it != mempools_.end() && it->second.no_split;
}

PoolKind DeviceAllocator::LookupKind(std::size_t rounded, std::uint32_t mempool) const {
  return LookupPoolFor(rounded, mempool != 0 && !PoolGrowsByArenas(mempool), *config_);
}

absl::Status DeviceAllocator::EndAllocateToPool(MemPoolId id) {
  // Destroyed after the lock is released (declared before it): the filter
  // may own a caller's context whose release calls back into the allocator
  // (the C ABI's release_ctx), which would deadlock under mu_.
  StreamFilter ended_filter;
  MutexLock l(&mu_);
  auto known = mempool_index_.find(id);
  auto it = known == mempool_index_.end()
                ? contexts_.end()
                : std::find_if(contexts_.begin(), contexts_.end(),
                               [&](const PoolContext& c) { return c.index == known->second; });
  if (it == contexts_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: pool (%d, %d) of device %d is not being allocated to", id.first, id.second,
        device_));
  }
  const std::uint32_t index = it->index;
  const bool was_quiet = quiet();
  if (!it->options.not_a_capture) {
    // PyTorch ends a pool's first context, which may be a capture's with a
    // context of the same pool nested in it: the capture goes on, so the
    // pool's next context takes its kind.
    auto nested = std::find_if(std::next(it), contexts_.end(), [&](const PoolContext& c) {
      return c.index == it->index && c.options.not_a_capture;
    });
    if (nested != contexts_.end()) {
      nested->options.not_a_capture = false;
    } else {
      --capture_contexts_;
    }
  }
  ended_filter = std::move(it->filter);
  contexts_.erase(it);
  if (was_quiet && !quiet()) RecordDeferredFrees();
  ForgetIfDrained(index);  // released while it was being allocated to
  // The context's own reference goes with ReleasePool, as in PyTorch.
  return absl::OkStatus();
}

absl::Status DeviceAllocator::ReleasePool(MemPoolId id) {
  MutexLock l(&mu_);
  auto known = mempool_index_.find(id);
  if (known == mempool_index_.end() || mempools_[known->second].use_count <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: release of pool (%d, %d) of device %d, which holds no reference", id.first,
        id.second, device_));
  }
  const std::uint32_t index = known->second;
  --mempools_[index].use_count;
  ForgetIfDrained(index);
  return absl::OkStatus();
}

absl::Status DeviceAllocator::SetPoolOptions(MemPoolId id, PoolOptions options) {
  MutexLock l(&mu_);
  absl::StatusOr<std::uint32_t> index = ReferencedPool(id, "options");
  if (!index.ok()) return index.status();
  PrivatePool& pool = mempools_[*index];
  pool.no_split = options.no_split;
  pool.use_on_oom = options.use_on_oom;
  return absl::OkStatus();
}

absl::StatusOr<PoolOptions> DeviceAllocator::GetPoolOptions(MemPoolId id) {
  MutexLock l(&mu_);
  absl::StatusOr<std::uint32_t> index = ReferencedPool(id, "options");
  if (!index.ok()) return index.status();
  const PrivatePool& pool = mempools_[*index];
  return PoolOptions{pool.no_split, pool.use_on_oom};
}

absl::StatusOr<bool> DeviceAllocator::CheckPoolLiveAllocations(MemPoolId id,
                                                                absl::Span<void* const> expected) {
  MutexLock l(&mu_);
  auto known = mempool_index_.find(id);
  if (known == mempool_index_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: pool (%d, %d) of device %d does not exist", id.first, id.second, device_));
  }
  const absl::flat_hash_set<void*> want(expected.begin(), expected.end());
  std::size_t live = 0;
  for (const auto& [addr, b] : allocated_) {
    if (b->mempool != known->second) continue;
    if (!want.contains(b->ptr())) return false;
    ++live;
  }
  return live == want.size();
}

std::uint32_t DeviceAllocator::RouteToPool(Stream stream) {
  // The latest context whose filter takes the stream wins, as in PyTorch.
  for (auto it = contexts_.rbegin(); it != contexts_.rend(); ++it) {
    if (it->filter == nullptr || it->filter(stream)) return it->index;
  }
  return 0;
}

void DeviceAllocator::PoolBlockFreed(std::uint32_t index) {
  PrivatePool& pool = mempools_[index];
  --pool.live;
  ForgetIfDrained(index);
}

void DeviceAllocator::ForgetIfDrained(std::uint32_t index) {
  auto it = mempools_.find(index);
  if (it == mempools_.end() || it->second.use_count > 0 || it->second.live > 0) return;
  for (const PoolContext& c : contexts_) {
    if (c.index == index) return;  // still being allocated to
  }
  // Released and empty, it drains: its blocks, all in segments of its own,
  // never serve the shared cache. A graph may still be replaying into them
  // on a stream cma never sees (PyTorch's current stream), so they are only
  // given back whole, with the cache's memory (ReleaseIdleSegments, which
  // waits for the streams their blocks name; cudaFree, under managed memory,
  // waits for the device), as PyTorch only cudaFrees a released pool's
  // segments. The pool stays known until the last of them has gone
  // (ReleaseSegment), so that emptying its cache by its id (what PyTorch's
  // MemPool does as it goes) finds them and, as in PyTorch, taking the id
  // again before then takes them back.
  if (it->second.segments == 0) {
    mempool_index_.erase(it->second.id);
    mempools_.erase(it);
  }
}

absl::StatusOr<Block*> DeviceAllocator::NewPoolSegment(std::size_t rounded, PoolKind pool,
                                                       Stream stream, std::uint32_t mempool) {
  if (PoolGrowsByArenas(mempool)) {
    absl::StatusOr<Block*> arena = NewArena(rounded, pool, stream);
    if (!arena.ok()) return arena.status();
    (*arena)->segment->owner_pool = mempool;
    ++mempools_[mempool].segments;
    (*arena)->mempool = mempool;
    return arena;
  }
  absl::StatusOr<Block*> b = NewClassicSegment(SegmentSizeFor(rounded), pool, stream, mempool);
  if (!b.ok() && absl::IsResourceExhausted(b.status())) {
    // Quiet, the cache's idle memory cannot be given back (a discard or a
    // free would break a capture).
    return absl::Status(b.status().code(),
                        absl::StrCat(b.status().message(),
                                     "; while a pool is being allocated to, cached memory cannot "
                                     "be given back: empty_cache before the capture makes room"));
  }
  if (!b.ok()) return b.status();
  (*b)->mempool = mempool;  // what a split of it leaves is the pool's too
  return b;
}

bool DeviceAllocator::PoolReleased(std::uint32_t index) const {
  auto it = mempools_.find(index);
  if (it == mempools_.end() || it->second.use_count > 0) return false;
  for (const PoolContext& c : contexts_) {
    if (c.index == index) return false;
  }
  return true;
}

void* DeviceAllocator::TakeFromUseOnOomPools(std::size_t rounded, std::size_t requested,
                                             Stream stream, std::uint32_t mempool,
                                             const AllocationHints* hints) {
  // An allocation routed to a pool (a capture, a MemPool context) is not
  // lent another pool's block: freed, it would go back to the lender while
  // the borrower's graph still replays into it (PyTorch refuses it too).
  if (mempool != 0) return nullptr;
  std::vector<std::uint32_t> lenders;
  for (const auto& [index, p] : mempools_) {
    // Advice cannot apply to another allocator's memory: such a pool lends
    // only to allocations without it.
    if (p.use_on_oom && p.use_count > 0 &&
        (hints == nullptr || p.source == nullptr)) {
      lenders.push_back(index);
    }
  }
  std::sort(lenders.begin(), lenders.end());  // the oldest pool first, whatever the map's order
  for (std::uint32_t index : lenders) {
    const PoolKind kind = LookupKind(rounded, index);
    Block* b = FindSameStream(rounded, kind, stream, index);
    if (b == nullptr) continue;
    const std::size_t take =
        !NoSplit(index) && ShouldSplit(b->size, rounded, kind, *config_) ? rounded : b->size;
    if (b->segment->arena && FreshPagesFor(b, take) > 0 &&
        !MakeRoomForPages(b, take, stream, /*everything=*/true).ok()) {
      ReturnBlock(b);
      continue;
    }
    void* p = HandOut(b, rounded, requested, kind, stream, index);
    if (!quiet()) {
      PlaceForAllocation(b, stream, hints);
    } else {
      b->placed = false;  // first touch places it, as Allocate's
      populate_.clear();
    }
    return p;
  }
  return nullptr;
}

bool DeviceAllocator::FenceStreamUses(Block* b) {
  absl::InlinedVector<Stream, 2> unfenced;
  for (Stream s : b->stream_uses) {
    absl::StatusOr<Event> ev = TakeEvent();
    if (ev.ok() && backend_->RecordEvent(*ev, s).ok()) {
      ++b->pending_events;
      pending_.push_back({b, *ev});
      continue;
    }
    if (ev.ok()) spare_events_.push_back(*ev);
    if (absl::Status w = backend_->SynchronizeStream(s); !w.ok()) {
      NotePlacementError(std::move(w));
      unfenced.push_back(s);
    }
  }
  b->stream_uses.assign(unfenced.begin(), unfenced.end());
  return unfenced.empty();
}

void DeviceAllocator::NoteCaptureFree(Block* b) {
  bool reuse = false;
  for (const PoolContext& c : contexts_) {
    reuse = reuse || (c.index == b->mempool && c.options.reuse_after_join);
  }
  if (!reuse || b->pages_discarded || b->hints != nullptr) return;
  // Every stream that used the block must be capturing into one capture:
  // a use outside it (or a backend that cannot tell) is ordered only by
  // the events the context's end records.
  CaptureFree wait;
  absl::InlinedVector<Stream, 4> streams(b->stream_uses.begin(), b->stream_uses.end());
  streams.push_back(b->stream);
  for (std::size_t i = 0; i < streams.size(); ++i) {
    absl::StatusOr<std::optional<CaptureFrontier>> f = backend_->CaptureFrontierOf(streams[i]);
    if (!f.ok() || !f->has_value() || (i > 0 && (*f)->capture != wait.capture)) return;
    wait.capture = (*f)->capture;
    wait.marks.insert(wait.marks.end(), (*f)->nodes.begin(), (*f)->nodes.end());
  }
  capture_frees_[b] = std::move(wait);
}

void DeviceAllocator::ReclaimJoinedFrees(Stream stream, std::uint32_t mempool) {
  // Only the block's own stream reuses it (a free block serves its stream):
  // another stream's joins say nothing of that stream's order. No candidate,
  // no backend call.
  bool any = false;
  for (const auto& [b, wait] : capture_frees_) {
    any = any || (b->stream == stream && b->mempool == mempool);
  }
  if (!any) return;
  absl::StatusOr<std::optional<CaptureFrontier>> f = backend_->CaptureFrontierOf(stream);
  if (!f.ok() || !f->has_value()) return;
  // Bounded, since every allocation on the stream walks again until the
  // join: a bigger graph keeps its frees until the context ends.
  constexpr std::size_t kMaxNodesWalked = 1 << 14;
  CaptureAncestors ancestors(
      (*f)->nodes, [this](CaptureNode n) { return backend_->CaptureNodeDependencies(n); },
      kMaxNodesWalked);
  std::vector<Block*> joined;
  for (const auto& [b, wait] : capture_frees_) {
    if (b->stream == stream && b->mempool == mempool && wait.capture == (*f)->capture &&
        ancestors.ReachesAll(wait.marks)) {
      joined.push_back(b);
    }
  }
  // Address order: the same reuse whatever the map's order.
  std::sort(joined.begin(), joined.end(),
            [](const Block* x, const Block* y) { return x->addr < y->addr; });
  for (Block* b : joined) {
    capture_frees_.erase(b);
    deferred_.erase(std::find(deferred_.begin(), deferred_.end(), b));
    b->pending_events = 0;
    b->stream_uses.clear();
    BecameFree(b);
  }
}

void DeviceAllocator::RecordDeferredFrees() {
  capture_frees_.clear();
  std::vector<Block*> blocks;
  blocks.swap(deferred_);
  for (Block* b : blocks) {
    // What Free would have done: an event on each other stream that used
    // the block, or a wait for that stream if no event can be recorded.
    // Only the deferral's own count goes: a block held by an earlier try
    // may still await events recorded then (on the streams it did fence).
    --b->pending_events;
    const bool fenced = FenceStreamUses(b);
    if (b->hints) {  // advice withdrawn now that calls may be made again
      ApplyAdvice(WithdrawHintAdvice(*b->hints), b->ptr(), b->size);
      b->hints.reset();
    }
    if (!fenced) {
      // Another stream may still use it and nothing orders a reuse after
      // that: held out of the pools, as a plain Free refuses, and tried
      // again by the next synchronising ProcessPendingFrees.
      ++b->pending_events;
      deferred_.push_back(b);
      continue;
    }
    if (b->pending_events == 0) BecameFree(b);
  }
  // Segments made while quiet get the config's advice and placement now.
  std::vector<std::uintptr_t> bases;
  bases.swap(unadvised_);
  for (std::uintptr_t base : bases) {
    auto found = segments_.find(base);
    if (found == segments_.end()) continue;  // released meanwhile
    Segment* seg = found->second;
    if (seg->arena) {
      ApplyAdvice(SegmentAdvice(*config_, device_, device_count_), seg->ptr_base(), seg->size);
    } else if (seg->first->next == nullptr && seg->first->is_free()) {
      PrepareSegment(seg->first, seg->first->stream);
    } else {
      ApplyAdvice(SegmentAdvice(*config_, device_, device_count_), seg->ptr_base(), seg->size);
    }
  }
}

absl::Status DeviceAllocator::RefuseWhileQuiet(const char* what) {
  if (!quiet()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "cma: %s on device %d while a private pool is being allocated to (a CUDA graph capture "
      "may be under way, and %s would make calls that break it); end the pool context first",
      what, device_, what));
}

}  // namespace cma
