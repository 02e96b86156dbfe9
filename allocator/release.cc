// DeviceAllocator's release of cached memory back to the backend: whole
// idle segments, after the streams that used them have finished.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {

// ---------------------------------------------------------------- release

std::size_t DeviceAllocator::ReleaseCachedSegments(std::size_t goal,
                                                   absl::flat_hash_set<Stream>* queued_on,
                                                   bool settled) {
  if (arena_mode()) {
    const std::size_t pages = goal == 0 ? idle_pages_ : (goal + kPageSize - 1) / kPageSize;
    std::size_t released =
        DiscardIdlePages(pages, 0, 0, nullptr, queued_on, settled) * kPageSize;
    // Pools' segments hold their memory whole (classic ones, and a captured
    // pool's arenas): the wholly free ones of released pools go too.
    if (goal == 0 || released < goal) {
      released += ReleaseIdleSegments(goal == 0 ? 0 : goal - released, 0, /*classic_only=*/true);
    }
    return released;
  }
  return ReleaseIdleSegments(goal);
}

bool DeviceAllocator::SettleLearnedTransfers() {
  if (learn_ == nullptr || !learn_->streams) return true;
  DrainLearnedTransfers();
  bool settled = true;
  for (Stream s : {learn_->away_stream, learn_->back_stream}) {
    if (absl::Status w = backend_->SynchronizeStream(s); !w.ok()) {
      NotePlacementError(std::move(w));
      settled = false;
    }
  }
  return settled;
}

std::size_t DeviceAllocator::ReleaseAsAsked(std::size_t goal,
                                           absl::flat_hash_set<Stream>* queued_on,
                                           bool settled) {
  absl::flat_hash_set<Stream> mine;
  if (queued_on == nullptr) queued_on = &mine;
  if (!SettleLearnedTransfers()) return 0;  // the memory stays: nothing lost, nothing given back
  release_asked_ = true;
  const std::size_t released = ReleaseCachedSegments(goal, queued_on, settled);
  if (learn_ != nullptr) DiscardKeptPages(queued_on);
  release_asked_ = false;
  if (learn_ != nullptr) {
    for (Stream s : *queued_on) {
      // The host function runs once the driver's work behind the discards
      // is done; without one (a backend that has none, or a failed call),
      // the stream's own wait.
      (void)backend_->LaunchHostFunction(s, [] {});
      if (absl::Status w = backend_->SynchronizeStream(s); !w.ok()) NotePlacementError(std::move(w));
    }
  }
  return released;
}

std::size_t DeviceAllocator::ReleaseIdleSegments(std::size_t goal, std::uint32_t mempool,
                                                 bool classic_only) {
  std::vector<Segment*> idle;
  for (auto& [base, seg] : segments_) {
    // (classic_only: not the shared cache's arenas nor the host tier; a
    // pool's own arenas are whole segments of that pool.)
    if (classic_only && ((seg->arena && seg->owner_pool == 0) || seg->host_tier)) continue;
    // A segment is wholly one pool's or wholly the shared cache's. None of
    // a live private pool's goes (a graph replays into those) but
    // `mempool`'s; a released pool's go, as PyTorch frees them.
    const std::uint32_t owner = seg->owner_pool;
    if (mempool != 0 ? owner != mempool : owner != 0 && !PoolReleased(owner)) continue;
    // Fully free, though possibly in pieces of different streams.
    bool all_free = true;
    for (const Block* b = seg->first; b != nullptr && all_free; b = b->next) {
      all_free = b->is_free();
    }
    if (all_free) idle.push_back(seg);
  }
  std::sort(idle.begin(), idle.end(),
            [](const Segment* a, const Segment* b) { return a->size > b->size; });
  std::size_t released = 0;
  absl::flat_hash_set<Stream> synced;
  for (Segment* seg : idle) {
    if (goal != 0 && released >= goal) break;
    // The segment's last users may still have work queued: wait for them
    // before the memory goes back.
    bool quiet = true;
    for (const Block* b = seg->first; b != nullptr && quiet; b = b->next) {
      if (synced.contains(b->stream)) continue;
      quiet = backend_->SynchronizeStream(b->stream).ok();
      if (quiet) synced.insert(b->stream);
    }
    if (!quiet) continue;
    released += seg->size;
    ReleaseSegment(seg);
  }
  if (!synced.empty()) ++stats_.num_sync_all_streams;
  return released;
}

void DeviceAllocator::ReleaseSegment(Segment* seg) {
  // On failure the blocks stay cached rather than lost.
  if (!FreeSegmentMemory(*seg).ok()) return;
  for (Block* b = seg->first; b != nullptr;) {
    Block* next = b->next;
    EraseFree(b);
    DeleteBlock(b);
    b = next;
  }
  UpdateStat(stats_.segment, seg->pool, -1);
  if (seg->arena) {
    const std::size_t populated = seg->pages.populated_count() * kPageSize;
    const std::size_t small = seg->pages.small_count() * kPageSize;
    UpdateStat(stats_.reserved_bytes, PoolKind::kSmall, -static_cast<std::int64_t>(small));
    UpdateStat(stats_.reserved_bytes, PoolKind::kLarge, -static_cast<std::int64_t>(populated - small));
    idle_pages_ -= seg->pages.populated_count();  // fully free: every populated page is idle
    if (seg->pinned) pinned_idle_pages_ -= seg->pages.populated_count();
    stats_.idle_populated_bytes -= static_cast<std::int64_t>(populated);
    stats_.virtual_bytes -= static_cast<std::int64_t>(seg->size);
  } else if (seg->host_tier) {
    stats_.host_resident_bytes[kAllPools].Sub(static_cast<std::int64_t>(seg->size));
    if (host_ledger_ != nullptr) host_ledger_->Give(seg->size);
  } else {
    UpdateStat(stats_.reserved_bytes, seg->pool, -static_cast<std::int64_t>(seg->size));
  }
  ++stats_.num_device_free;
  segments_.erase(seg->base);
  const std::uint32_t owner_pool = seg->owner_pool;
  delete seg;
  if (owner_pool != 0) {  // a released pool goes with the last of its own segments
    --mempools_[owner_pool].segments;
    ForgetIfDrained(owner_pool);
  }
}

absl::Status DeviceAllocator::FreeSegmentMemory(const Segment& seg) {
  if (seg.source != nullptr) return seg.source->Free(device_, seg.ptr_base(), seg.size);
  return backend_->FreeManaged(seg.ptr_base());
}

absl::Status DeviceAllocator::EmptyCache() {
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("empty_cache"); !s.ok()) return s;
  // A device this process never allocated on holds nothing, and a call
  // there would make a CUDA context (torch.cuda.empty_cache in a rank).
  if (!budget_planned_) return absl::OkStatus();
  ProcessPendingFrees(/*synchronize=*/true);
  CoalesceUnmerged();
  absl::flat_hash_set<Stream> queued_on;
  // A page holding free blocks of several streams is discarded too, once
  // each of them has been waited for (as PyTorch's empty_cache waits for the
  // device): else what earlier work left on such pages stays reserved.
  const bool settled = arena_mode() && idle_pages_ != 0 && SettleFreeBlockStreams();
  ReleaseAsAsked(0, &queued_on, settled);
  // The discards run behind the work queued on their streams; the memory is
  // the driver's only once they have (PyTorch's empty_cache returns with its
  // cudaFree done: another process, or nvidia-smi, may look right after).
  // A stream that cannot be waited for keeps its discard queued.
  for (Stream s : queued_on) {
    if (absl::Status w = backend_->SynchronizeStream(s); !w.ok()) NotePlacementError(std::move(w));
  }
  if (!queued_on.empty()) ++stats_.num_sync_all_streams;
  // Arenas hold no memory once their idle pages are discarded, but a user
  // who empties the cache expects the address ranges back too.
  if (arena_mode()) ReleaseIdleSegments(0);
  return absl::OkStatus();
}

absl::Status DeviceAllocator::ForgetStream(Stream stream) {
  if (stream == kDefaultStream) {
    return absl::InvalidArgumentError("cma: the default stream cannot be forgotten");
  }
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("forget_stream"); !s.ok()) return s;
  // Whether anything here names the stream (only such devices wait for it).
  bool named = known_streams_.contains(stream) || staging_readers_.contains(stream);
  for (auto& [addr, b] : allocated_) {
    named = named || b->stream == stream ||
            std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) != b->stream_uses.end();
  }
  if (!named) return absl::OkStatus();
  // Everything queued there completes first; after that nothing the stream
  // ran can touch memory, so its blocks are any stream's to reuse.
  if (absl::Status s = backend_->SynchronizeStream(stream); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cma: cannot forget a stream whose work cannot "
                                               "be waited for: ", s.message()));
  }
  ProcessPendingFrees(/*synchronize=*/false);
  FlushRecent();
  std::vector<Block*> orphans;
  for (BlockPool* pool : {&small_pool_, &large_pool_, &host_pool_}) {
    for (Block* b : *pool) {  // every private pool's too
      if (b->stream == stream && b->segment != nullptr) orphans.push_back(b);
    }
  }
  for (Block* b : orphans) {
    EraseFree(b);
    b->stream = kDefaultStream;
    b->free_seq = 0;  // its work is done: idle for every stream
    ReturnBlock(b);
  }
  for (Block* b : deferred_) {
    if (b->stream == stream) b->stream = kDefaultStream;
    // (A free held because this stream could not be fenced is freed at the
    // next synchronising try, now that the stream has been waited for.)
    b->stream_uses.erase(std::remove(b->stream_uses.begin(), b->stream_uses.end(), stream),
                         b->stream_uses.end());
  }
  for (auto& [addr, b] : allocated_) {
    if (b->stream == stream) b->stream = kDefaultStream;
    b->stream_uses.erase(std::remove(b->stream_uses.begin(), b->stream_uses.end(), stream),
                         b->stream_uses.end());
  }
  for (const PendingFree& pf : pending_) {
    if (pf.block->stream == stream) pf.block->stream = kDefaultStream;
  }
  known_streams_.erase(stream);
  staging_readers_.erase(stream);  // its reads of the staging have run
  idle_through_.erase(stream);
  if (auto m = idle_marks_.find(stream); m != idle_marks_.end()) {
    for (const IdleMark& mark : m->second) spare_events_.push_back(mark.event);
    idle_marks_.erase(m);
  }
  if (last_stream_ == stream) last_stream_ = kDefaultStream;
  if (sleep_wake_stream_ == stream) sleep_wake_stream_ = kDefaultStream;  // its discards ran
  CoalesceUnmerged();
  return absl::OkStatus();
}

void DeviceAllocator::SetBudget(std::size_t bytes) {
  MutexLock l(&mu_);
  // The host part is planned now (an error is the next allocation's, which
  // plans again); the budget is the caller's from here on.
  (void)PlanBudget();
  budget_set_ = true;
  budget_ = bytes;
  stats_.managed_budget_bytes = static_cast<std::int64_t>(bytes);
  const auto reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  if (reserved > bytes && !quiet()) {  // else the next allocations keep to it
    CoalesceUnmerged();
    ReleaseAsAsked(reserved - bytes);
  }
}

void DeviceAllocator::SetSharedSettings(const SharedSettings& s) {
  MutexLock l(&mu_);
  config_copy_.max_split_size = s.max_split_size;
  config_copy_.roundup_power2_divisions = s.roundup_power2_divisions;
  config_copy_.garbage_collection_threshold = s.garbage_collection_threshold;
}

AllocatorConfig DeviceAllocator::LiveConfig() {
  MutexLock l(&mu_);
  return config_copy_;
}

}  // namespace cma
