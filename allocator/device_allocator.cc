#include "backends/mutex_lock.h"
#include "allocator/device_allocator.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/format.h"
#include "policy/oversubscription.h"
#include "policy/release_policy.h"
#include "policy/size_policy.h"

namespace cma {

DeviceAllocator::DeviceAllocator(int device, int device_count, Backend* backend,
                                 const AllocatorConfig* config, std::size_t device_total,
                                 std::size_t host_share, HostLedger* host_ledger)
    : device_(device),
      device_count_(device_count),
      backend_(backend),
      config_copy_(*config),
      config_(&config_copy_),
      device_total_(device_total),
      host_share_(host_share),
      host_ledger_(host_ledger),
      discard_fence_(config->wake_fence) {
  if (config->learn_step) learn_ = std::make_unique<LearnState>();
  // A pool that empties frees its btree root node and the next insert
  // allocates it again; a sentinel no lookup can match keeps that malloc off
  // the fast path.
  for (BlockPool* pool : {&small_pool_, &large_pool_, &host_pool_}) {
    Block* sentinel = new Block;
    sentinel->mempool = ~std::uint32_t{0};
    sentinel->stream = ~Stream{0};
    sentinel->size = ~std::size_t{0};
    sentinel->addr = ~std::uintptr_t{0};
    pool->insert(sentinel);
  }
}

DeviceAllocator::~DeviceAllocator() {
  MutexLock l(&mu_);
  DrainLearnedTransfers();
  ProcessPendingFrees(/*synchronize=*/true);
  // Copies out of the staging may still be queued on the last Wake's stream
  // and on the streams of Moves that restored from it.
  if (staging_.capacity() > 0) {
    (void)backend_->SynchronizeStream(sleep_wake_stream_);
    for (Stream s : staging_readers_) (void)backend_->SynchronizeStream(s);
    (void)staging_.Release(*backend_);
  }
  // Another allocator's free does not wait for the GPU as cudaFree does:
  // the streams that may still use a sourced segment are waited for first,
  // and so are events still pending (recorded for deferred frees just now,
  // or not waited for above).
  for (const PendingFree& p : pending_) (void)backend_->SynchronizeEvent(p.event);
  absl::flat_hash_set<Stream> waited;
  for (auto& [base, seg] : segments_) {
    if (seg->source == nullptr) continue;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      for (Stream s : b->stream_uses) {
        if (waited.insert(s).second) (void)backend_->SynchronizeStream(s);
      }
      if (waited.insert(b->stream).second) (void)backend_->SynchronizeStream(b->stream);
    }
  }
  for (auto& [base, seg] : segments_) {
    (void)FreeSegmentMemory(*seg);
    if (seg->host_tier && host_ledger_ != nullptr) host_ledger_->Give(seg->size);
    for (Block* b = seg->first; b != nullptr;) {
      Block* next = b->next;
      delete b;
      b = next;
    }
    delete seg;
  }
  discard_fence_.Release(*backend_);
  if (learn_ != nullptr) {
    for (auto& [addr, e] : learn_->fetches) spare_events_.push_back(e.event);
    if (learn_->streams) {
      for (Stream t : {learn_->away_stream, learn_->back_stream}) {
        (void)backend_->SynchronizeStream(t);
        (void)backend_->DestroyStream(t);
      }
    }
  }
  for (auto& [s, marks] : idle_marks_) {
    for (const IdleMark& m : marks) spare_events_.push_back(m.event);
  }
  for (Event e : spare_events_) (void)backend_->DestroyEvent(e);
  for (auto& p : pending_) (void)backend_->DestroyEvent(p.event);
  for (Block* b : spare_blocks_) delete b;
  // The pools' other entries were deleted with their segments above; only
  // the sentinels (always last) are still ours to delete.
  for (BlockPool* pool : {&small_pool_, &large_pool_, &host_pool_}) delete *pool->rbegin();
}

absl::Status DeviceAllocator::CheckStream(Stream stream) {
  if (stream == last_stream_ || known_streams_.contains(stream)) {
    last_stream_ = stream;
    return absl::OkStatus();
  }
  absl::Status s = backend_->ValidateStream(device_, stream);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cma: invalid stream for device ", device_, ": ", s.message()));
  }
  known_streams_.insert(stream);
  last_stream_ = stream;
  return absl::OkStatus();
}

Block* DeviceAllocator::NewBlock() {
  if (spare_blocks_.empty()) return new Block;
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  *b = Block();
  return b;
}

void DeviceAllocator::DeleteBlock(Block* b) {
  b->unmerged = false;  // entries left in unmerged_ now read as stale
  b->segment = nullptr;
  spare_blocks_.push_back(b);
}

void DeviceAllocator::CountInactiveSplit(const Block* b, int sign) {
  if (!b->is_split()) return;
  UpdateStat(stats_.inactive_split, b->segment->pool, sign);
  UpdateStat(stats_.inactive_split_bytes, b->segment->pool,
             sign * static_cast<std::int64_t>(b->size));
}

void DeviceAllocator::InsertFree(Block* b) {
  FreeListOf(b->segment).insert(b);
  CountInactiveSplit(b, +1);
}

void DeviceAllocator::EraseFree(Block* b) {
  Block*& recent = RecentOf(b->segment->pool);
  if (recent == b) {
    recent = nullptr;
  } else {
    FreeListOf(b->segment).erase(b);
  }
  CountInactiveSplit(b, -1);
}

// ---------------------------------------------------------------- allocate

absl::Status DeviceAllocator::TooLarge(std::size_t bytes) const {
  return TooLarge(bytes, host_budget_.load());
}

absl::Status DeviceAllocator::TooLarge(std::size_t bytes, std::size_t host) const {
  return absl::InvalidArgumentError(absl::StrFormat(
      "cma: request of %d bytes (%s) exceeds the total memory of device %d (%s)%s", bytes,
      FormatBytes(bytes), device_, FormatBytes(device_total_),
      host == 0 ? "" : absl::StrCat(" and the host part of its budget (", FormatBytes(host), ")")));
}

absl::Status DeviceAllocator::PlanBudget() {
  if (budget_planned_) return absl::OkStatus();
  absl::StatusOr<TierBudgets> planned = PlannedBudgets();
  if (!planned.ok()) return planned.status();
  CommitBudget(*planned);
  return absl::OkStatus();
}

absl::StatusOr<TierBudgets> DeviceAllocator::PlannedBudgets() {
  absl::StatusOr<MemInfo> mem = backend_->GetMemInfo(device_);
  if (!mem.ok()) return mem.status();
  // Default budget: never more managed memory than the device has free now,
  // because oversubscribing managed memory can hang a shared GPU; beyond it
  // only as the oversubscription mode places it (on the host).
  return PlanTierBudgets(*config_, device_, mem->free_bytes, host_share_);
}

void DeviceAllocator::CommitBudget(const TierBudgets& planned) {
  if (!budget_set_) budget_ = planned.device;
  host_budget_.store(planned.host);
  stats_.managed_budget_bytes = static_cast<std::int64_t>(budget_);
  stats_.host_budget_bytes = static_cast<std::int64_t>(planned.host);
  budget_planned_ = true;
}

absl::StatusOr<void*> DeviceAllocator::Allocate(std::size_t bytes, Stream stream,
                                                 const AllocationHints* hints) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("cma: cannot allocate 0 bytes");
  }
  // (The host's share bounds the host part, planned or not: checked exactly below.)
  if (bytes > device_total_ + host_share_) {
    return TooLarge(bytes);
  }
  MutexLock l(&mu_);
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  const bool quiet = ABSL_PREDICT_FALSE(this->quiet());
  if (quiet && hints != nullptr) return RefuseWhileQuiet("advice for an allocation");
  if (ABSL_PREDICT_FALSE(!budget_planned_)) {
    // Planned first, committed only for a request that may be served: bad
    // input leaves the state unchanged.
    absl::StatusOr<TierBudgets> planned = PlannedBudgets();
    if (!planned.ok()) return planned.status();
    if (bytes > device_total_ + planned->host) return TooLarge(bytes, planned->host);
    CommitBudget(*planned);
  } else if (ABSL_PREDICT_FALSE(bytes > device_total_ + host_budget_.load())) {
    return TooLarge(bytes);  // (the check before the lock bounds it by the host share)
  }
  const std::uint32_t mempool = ABSL_PREDICT_FALSE(!contexts_.empty()) ? RouteToPool(stream) : 0;
  if (ABSL_PREDICT_FALSE(!capture_frees_.empty()) && mempool != 0) ReclaimJoinedFrees(stream, mempool);
  if (!pending_.empty() && !quiet) ProcessPendingFrees(/*synchronize=*/false);
  BoundUnmerged();

  const std::size_t rounded = RoundRequest(bytes, *config_);
  if (ABSL_PREDICT_FALSE(learn_ != nullptr) && !quiet) LearnBeforeAlloc(rounded);
  // A private pool's segments keep small and large blocks apart as
  // PyTorch's do, in arena mode too, unless it grows by arenas (NewPoolSegment).
  const PoolKind pool = ABSL_PREDICT_FALSE(mempool != 0) ? LookupKind(rounded, mempool)
                                                         : BlockPoolFor(rounded, *config_);
  // Oversubscription: what the caller routes to the host, and what can never
  // fit the device's part, goes to the host at once.
  // (A budget of 0, PyTorch's memory fraction 0, refuses everything.)
  // (A private pool's blocks stay in its own segments, on the device.)
  const bool spill =
      ABSL_PREDICT_FALSE(host_budget_ != 0) && !quiet && budget_ != 0 && mempool == 0;
  const bool planned = spill && !iteration_.plan_host.empty() && PlannedOnHost(rounded);
  if (spill && (host_routing_ > 0 || rounded > budget_ || planned)) {
    absl::StatusOr<void*> h = AllocateOnHost(rounded, bytes, pool, stream);
    if (h.ok()) return h;
    if (host_routing_ > 0 || rounded > budget_) {
      ++stats_.num_ooms;
      return absl::ResourceExhaustedError(OomMessage(bytes, h.status()));
    }
    // (Planned only: the device may still hold it.)
  }
  // The steady state: the block the last free of this pool gave back, of
  // exactly this size (the best fit there is). Its pages are all populated:
  // it was in use, and discards move it into the pool first.
  if (Block*& recent = RecentOf(pool); recent != nullptr) {
    Block* b = recent;
    if (b->stream == stream && b->size == rounded && b->mempool == mempool) {
      EraseFree(b);
      void* p = HandOut(b, rounded, bytes, pool, stream, mempool, /*all_populated=*/true);
      if (!quiet) PlaceForAllocation(b, stream, hints);
      return p;
    }
    FlushRecent(recent);  // the lookups below see every free block
  }
  absl::Status cause;
  // The second pass is the out-of-memory retry: wait for pending frees,
  // reuse what they return, give the idle cache back, then try once more.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool retry = attempt == 1;
    // Oversubscribed and the device's part is full: a cached host block
    // serves before the retry's synchronisation (the steady state of a
    // repeating workload makes no call).
    if (retry && spill) {
      if (Block* h = TakeHostBlock(rounded, stream)) {
        stats_.host_overflow_bytes += static_cast<std::int64_t>(bytes);
        return HandOutOnHost(h, bytes, stream);
      }
    }
    if (retry) {
      ++stats_.num_alloc_retries;
      if (!quiet) ProcessPendingFrees(/*synchronize=*/true);
      CoalesceUnmerged();
    }
    std::size_t new_pages = 0;  // pages that `rounded` bytes of b would populate
    // A private pool's own free blocks first; else it grows by a segment of
    // its own (PoolSegment), never by the shared cache's room.
    Block* b = mempool != 0 ? FindSameStream(rounded, pool, stream, mempool, &new_pages) : nullptr;
    const bool no_split = mempool != 0 && NoSplit(mempool);
    if (ABSL_PREDICT_FALSE(no_split) && b != nullptr && b->size > SegmentSizeFor(rounded)) {
      ReturnBlock(b);  // a whole block far larger than a segment for this request: not for it
      b = nullptr;
    }
    Segment* made = nullptr;  // a segment made for this request, if any
    if (ABSL_PREDICT_FALSE(mempool != 0) && !(b != nullptr && new_pages == 0) &&
        PoolGrowsByArenas(mempool) &&
        AdoptIdleStreams(rounded, pool, stream, /*synchronize=*/retry && !quiet,
                         /*may_query=*/!quiet, mempool)) {
      // As the shared cache's arenas do (below), within the pool's own.
      if (b != nullptr) ReturnBlock(b);
      CoalesceUnmerged();
      b = FindSameStream(rounded, pool, stream, mempool, &new_pages);
    }
    if (ABSL_PREDICT_FALSE(mempool != 0) && b == nullptr) {
      absl::StatusOr<Block*> fresh = NewPoolSegment(rounded, pool, stream, mempool);
      if (!fresh.ok()) {
        if (!absl::IsResourceExhausted(fresh.status())) return fresh.status();
        cause = fresh.status();
        continue;
      }
      b = *fresh;
      new_pages = FreshPagesFor(b, rounded);
    }
    if (b == nullptr) b = FindSameStream(rounded, pool, stream, 0, &new_pages);
    // Known to need no new page: then there is nothing to make room for.
    bool populated = b != nullptr && new_pages == 0;
    if (arena_mode() && mempool == 0) {
      // New pages raise the device's high-water mark for good (the driver
      // keeps discarded memory with its pages until something else needs
      // it). Other streams' free blocks, merged with this stream's, may hold
      // the request in populated pages.
      // Quiet, only streams already known idle: no query may be made.
      if (!populated && AdoptIdleStreams(rounded, pool, stream, /*synchronize=*/retry && !quiet,
                                         /*may_query=*/!quiet)) {
        if (b != nullptr) ReturnBlock(b);
        CoalesceUnmerged();
        b = FindSameStream(rounded, pool, stream, 0, &new_pages);
        populated = b != nullptr && new_pages == 0;
      }
    } else if (b == nullptr && !quiet) {
      b = FindCrossStream(rounded, pool, stream, /*synchronize=*/retry);
    }
    if (b == nullptr && spill && !retry && !DeviceHasRoomFor(rounded)) {
      // No new arena whose pages could not be populated anyway.
      cause = absl::ResourceExhaustedError("the device's part of the budget is full");
      continue;
    }
    if (b == nullptr) {
      if (!arena_mode()) {
        const std::size_t release =
            retry ? 0
                  : ReleaseBeforeGrowth(
                        *config_, static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current),
                        static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].peak),
                        SegmentSizeFor(rounded), budget_);
        if (!quiet && (retry || release > 0)) ReleaseCachedSegments(release);
      }
      absl::StatusOr<Block*> fresh = NewSegment(rounded, pool, stream);
      if (!fresh.ok()) {
        if (!absl::IsResourceExhausted(fresh.status())) return fresh.status();
        cause = fresh.status();
        continue;
      }
      b = *fresh;
      made = b->segment;
    }
    const std::size_t take =
        !no_split && ShouldSplit(b->size, rounded, pool, *config_) ? rounded : b->size;
    // The steady state (a reused block, all pages populated) skips this.
    if (b->segment->arena && !(populated && take == rounded)) {
      // Pages the block needs that hold nothing yet must fit the budget.
      if (absl::Status s = MakeRoomForPages(b, take, stream, /*everything=*/retry); !s.ok()) {
        ReturnBlock(b);  // unchanged: back into its pool
        // The arena made for this request holds nothing and no stream has
        // used it: give its address range back rather than keep an empty
        // rival to the populated arenas that the retry should reuse. Any
        // other arena may still be touched by queued work (a discard): only
        // ReleaseIdleSegments, which synchronises, frees those.
        // Quiet, no memory is freed (cudaFree breaks a capture): it stays
        // cached until the next release.
        if (made != nullptr && !quiet) ReleaseSegment(made);
        cause = s;
        continue;
      }
    }
    void* p = HandOut(b, rounded, bytes, pool, stream, mempool);
    if (!quiet) {
      PlaceForAllocation(b, stream, hints);
    } else {
      b->placed = false;  // first touch places it; no call on a capturing stream
      populate_.clear();
    }
    return p;
  }
  if (void* p = TakeFromUseOnOomPools(rounded, bytes, stream, mempool, hints)) return p;
  if (spill) {
    absl::StatusOr<void*> h = AllocateOnHost(rounded, bytes, pool, stream);
    if (h.ok()) {
      stats_.host_overflow_bytes += static_cast<std::int64_t>(bytes);
      return h;
    }
    cause = absl::Status(h.status().code(),
                         absl::StrCat(cause.message(), "; then: ", h.status().message()));
  }
  ++stats_.num_ooms;
  return absl::ResourceExhaustedError(OomMessage(bytes, cause));
}

absl::Status DeviceAllocator::DiagnoseBadFree(void* ptr) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  const Segment* seg = SegmentAt(addr);
  if (seg == nullptr) return NotMine();
  for (const Block* b = seg->first; b != nullptr; b = b->next) {
    if (addr < b->addr || addr >= b->addr + b->size) continue;
    if (b->addr == addr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cma: double free of %p on device %d (the block is already free)",
                          ptr, device_));
    }
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: %p points %d bytes into a block at %p; free takes the pointer allocate returned",
        ptr, addr - b->addr, b->ptr()));
  }
  return absl::InternalError("cma: segment does not cover its own range");
}

void* DeviceAllocator::HandOut(Block* b, std::size_t rounded, std::size_t requested,
                               PoolKind pool, Stream stream, std::uint32_t mempool,
                               bool all_populated) {
  b->stream = stream;
  b->allocated = true;
  b->unmerged = false;
  const bool whole = mempool != 0 && NoSplit(mempool);
  if (!whole && ShouldSplit(b->size, rounded, pool, *config_)) {
    // A block taken from another stream may border a free block of this
    // stream: let the next coalescing merge them.
    ReturnBlock(SplitAt(b, b->addr + rounded));
  }
  b->no_split = whole;
  if (ABSL_PREDICT_FALSE(mempool != 0)) ++mempools_[mempool].live;
  b->mempool = mempool;
  b->requested = requested;
  b->disposable = false;
  b->keep = false;
  b->pages_discarded = false;
  b->discarded_from = 0;
  b->sleep_dropped = false;
  b->away = false;
  b->used_on = stream;
  b->stream_uses.clear();
  b->routed_to_host = b->segment->host_tier && host_routing_ > 0;
  if (ABSL_PREDICT_FALSE(learn_ != nullptr) && mempool == 0) {
    learn_->schedule.AllocDone(b->addr, LearnedExtent(*b, /*carried=*/false));
  }
  if (ABSL_PREDICT_FALSE(iteration_.recording)) RecordAllocation(b);
  const PoolKind size_class = b->size_class = PoolFor(rounded);
  if (b->segment->arena) AcquirePages(b, all_populated);
  allocated_[b->addr] = b;
  UpdateStat(stats_.allocation, size_class, 1);
  UpdateStat(stats_.allocated_bytes, size_class, b->size);
  UpdateStat(stats_.requested_bytes, size_class, requested);
  UpdateStat(stats_.active, size_class, 1);
  UpdateStat(stats_.active_bytes, size_class, b->size);
  return b->ptr();
}

Block* DeviceAllocator::SplitAt(Block* b, std::uintptr_t at) {
  Block* upper = NewBlock();
  upper->addr = at;
  upper->size = b->addr + b->size - at;
  upper->stream = b->stream;
  upper->segment = b->segment;
  upper->placed = b->placed;  // placement of b's range changes only after this
  upper->free_seq = b->free_seq;
  upper->location = b->location;
  upper->mempool = b->mempool;
  upper->no_split = b->no_split;  // a checkpoint's carve leaves the pool's pieces as they were
  upper->prev = b;
  upper->next = b->next;
  if (b->next != nullptr) b->next->prev = upper;
  b->next = upper;
  b->size = at - b->addr;
  return upper;
}

// ---------------------------------------------------------------- free

absl::Status DeviceAllocator::Free(void* ptr) {
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  MutexLock l(&mu_);
  auto it = allocated_.find(addr);
  if (ABSL_PREDICT_FALSE(it == allocated_.end())) return DiagnoseBadFree(ptr);
  Block* b = it->second;
  if (ABSL_PREDICT_FALSE(learn_ != nullptr)) {
    if (!quiet()) {
      LearnFree(b);
    } else {
      DrainLearnedTransfers();  // its stream uses are recorded below
    }
  }

  // Work queued on other streams may still use the block: record an event on
  // each and keep the block out of the pools until they complete. If an event
  // cannot be recorded, wait for the stream instead; if even that fails the
  // free is refused and the block stays allocated.
  // While quiet no event, sync or advice call may be made (a capture may be
  // under way): a block whose free needs one (events on other streams, the
  // order after a Sleep's discard, withdrawing its advice, discarding its
  // pages sent away) waits, out of
  // the pools, until the last pool context ends.
  const bool defer = ABSL_PREDICT_FALSE(quiet()) &&
                     (!b->stream_uses.empty() || b->pages_discarded || b->hints != nullptr ||
                      b->away);
  absl::InlinedVector<Event, 2> events;
  absl::Status failure;
  for (Stream s : defer ? absl::Span<const Stream>() : absl::Span<const Stream>(b->stream_uses)) {
    absl::StatusOr<Event> ev = TakeEvent();
    if (!ev.ok()) {
      failure = ev.status();
      break;
    }
    if (absl::Status r = backend_->RecordEvent(*ev, s); !r.ok()) {
      spare_events_.push_back(*ev);
      failure = r;
      break;
    }
    events.push_back(*ev);
  }
  if (!failure.ok()) {
    for (Event e : events) spare_events_.push_back(e);
    events.clear();
    for (Stream s : b->stream_uses) {
      if (absl::Status w = backend_->SynchronizeStream(s); !w.ok()) {
        return absl::InternalError(absl::StrCat(
            "cma: free of ", absl::StrFormat("%p", ptr),
            " could not order against a stream that used it (", failure.message(), "; ",
            w.message(), "); the block stays allocated"));
      }
    }
  }

  allocated_.erase(it);
  if (ABSL_PREDICT_FALSE(iteration_.recording)) RecordFree(addr);
  if (ABSL_PREDICT_FALSE(!staged_.empty())) Unstage(addr);
  if (b->hints && !defer) {
    ApplyAdvice(WithdrawHintAdvice(*b->hints), b->ptr(), b->size);
    b->hints.reset();
  }
  CountFreed(b);
  if (defer) {
    b->pending_events = 1;
    deferred_.push_back(b);
    if (ABSL_PREDICT_FALSE(b->mempool != 0)) NoteCaptureFree(b);
    return absl::OkStatus();
  }
  b->stream_uses.clear();
  if (!events.empty()) {
    b->pending_events = static_cast<int>(events.size());
    for (Event e : events) pending_.push_back({b, e});
    return absl::OkStatus();
  }
  BecameFree(b, /*keep_recent=*/true);
  const std::size_t reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  const std::size_t excess = ReleaseAfterFree(
      *config_, reserved,
      arena_mode() ? reserved - static_cast<std::size_t>(stats_.idle_populated_bytes) +
                         pinned_idle_pages_ * kPageSize
                   : static_cast<std::size_t>(stats_.active_bytes[kAllPools].current));
  if (ABSL_PREDICT_FALSE(excess > 0) && !quiet()) {
    CoalesceUnmerged();
    ReleaseCachedSegments(excess);
  }
  BoundUnmerged();
  return absl::OkStatus();
}

void DeviceAllocator::CountFreed(Block* b) {
  UpdateStat(stats_.allocation, b->size_class, -1);
  UpdateStat(stats_.allocated_bytes, b->size_class, -static_cast<std::int64_t>(b->size));
  UpdateStat(stats_.requested_bytes, b->size_class, -static_cast<std::int64_t>(b->requested));
  b->allocated = false;
  b->requested = 0;
}

void DeviceAllocator::BecameFree(Block* b, bool keep_recent) {
  UpdateStat(stats_.active, b->size_class, -1);
  UpdateStat(stats_.active_bytes, b->size_class, -static_cast<std::int64_t>(b->size));
  if (b->segment->arena) ReleasePages(b);
  bool forgot_pages = false;
  if (ABSL_PREDICT_FALSE(b->away)) {
    forgot_pages = true;
    ForgetAway(b);
  }
  if (ABSL_PREDICT_FALSE(b->pages_discarded)) {
    forgot_pages = true;
    // A Sleep discarded its pages on sleep_wake_stream_: whoever populates them
    // next is ordered after that (the block's stream waits for it), and
    // the page map learns they hold nothing.
    b->pages_discarded = false;
    (void)OrderAfter(b->stream, sleep_wake_stream_);
    if (b->segment->arena) {
      DiscardPagesInside(b, /*already_discarded=*/true, /*pool_too=*/false, b->discarded_from);
    }
    b->discarded_from = 0;
  }
  OnFreed(b);
  b->free_seq = ++free_seq_;
  // discard_on_free has just discarded its pages, or a Sleep had: not the
  // steady-state case (the last-freed slot holds only wholly populated blocks).
  if (!keep_recent || config_->discard_on_free || forgot_pages || b->segment->host_tier) {
    ReturnBlock(b);
    if (ABSL_PREDICT_FALSE(b->mempool != 0)) PoolBlockFreed(b->mempool);
    return;
  }
  Block*& recent = RecentOf(b->segment->pool);
  if (recent != nullptr) FlushRecent(recent);
  recent = b;
  CountInactiveSplit(b, +1);  // counted as in its pool
  if (ABSL_PREDICT_FALSE(b->mempool != 0)) PoolBlockFreed(b->mempool);
}

void DeviceAllocator::FlushRecent(Block*& recent) {
  Block* b = recent;
  recent = nullptr;
  FreeListOf(b->segment).insert(b);  // already counted as free
  b->unmerged = true;
  unmerged_.push_back(b);
}

void DeviceAllocator::FlushRecent() {
  for (Block*& recent : recent_) {
    if (recent != nullptr) FlushRecent(recent);
  }
}

void DeviceAllocator::AbsorbNext(Block* b) {
  Block* next = b->next;
  EraseFree(next);
  MergePlacement(b, *next);
  b->free_seq = std::max(b->free_seq, next->free_seq);
  b->size += next->size;
  b->next = next->next;
  if (next->next != nullptr) next->next->prev = b;
  DeleteBlock(next);
}

void DeviceAllocator::MergePlacement(Block* b, const Block& next) const {
  const Placement m = MergedPlacement({b->placed, b->location}, {next.placed, next.location},
                                      Location::Device(device_));
  b->placed = m.placed;
  b->location = m.location;
}

DeviceAllocator::Placement DeviceAllocator::MergedPlacement(Placement a, Placement b,
                                                           Location home) {
  if (a.placed && b.placed && a.location == b.location) return a;
  // Part of the merged block was put away from the device (a Move to the
  // host): remember that, so that its next hand-out brings it back. Its
  // contents are dead then, so a discard-and-prefetch costs no migration.
  for (const Placement& part : {a, b}) {
    if (part.placed && part.location != home) return part;
  }
  return {false, a.location};  // where first touch puts it
}

void DeviceAllocator::ReturnBlock(Block* b) {
  b->unmerged = true;
  unmerged_.push_back(b);
  InsertFree(b);
  // No merging here: callers may hold free blocks outside the pools (a
  // lookup's pick, an adoption list) that a merge would delete. Allocate and
  // Free bound the list where nothing is held (BoundUnmerged).
}

void DeviceAllocator::BoundUnmerged() {
  if (ABSL_PREDICT_FALSE(unmerged_.size() >= kMaxUnmerged)) CoalesceUnmerged();
}

void DeviceAllocator::CoalesceUnmerged() {
  FlushRecent();
  for (Block* b : unmerged_) {
    // Stale entries: handed out again, merged away, or seen already.
    if (!b->unmerged) continue;
    b->unmerged = false;
    if (!b->is_free()) continue;
    // Neighbours may themselves be runs of unmerged pieces: walk to the
    // first free piece of the run, then absorb the rest into it.
    Block* first = b;
    while (Mergeable(first->prev, first)) first = first->prev;
    if (!Mergeable(first->next, first)) continue;
    EraseFree(first);
    while (Mergeable(first->next, first)) AbsorbNext(first);
    InsertFree(first);
  }
  unmerged_.clear();
}

absl::StatusOr<Event> DeviceAllocator::TakeEvent() {
  if (!spare_events_.empty()) {
    Event e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  return backend_->CreateEvent(device_);
}

void DeviceAllocator::ProcessPendingFrees(bool synchronize) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    PendingFree pf = pending_[i];
    bool done;
    if (synchronize) {
      done = backend_->SynchronizeEvent(pf.event).ok();
    } else {
      absl::StatusOr<bool> q = backend_->QueryEvent(pf.event);
      done = q.ok() && *q;
    }
    if (!done) {  // never reuse memory that queued work may still touch
      pending_[kept++] = pf;
      continue;
    }
    spare_events_.push_back(pf.event);
    Block* b = pf.block;
    if (--b->pending_events == 0) BecameFree(b);
  }
  pending_.resize(kept);
  // Deferred frees whose fencing failed, when the pools may make calls again.
  if (ABSL_PREDICT_FALSE(synchronize && !deferred_.empty()) && !quiet()) {
    RecordDeferredFrees();
  }
}

std::string DeviceAllocator::OomMessage(std::size_t bytes, const absl::Status& cause) {
  absl::StatusOr<MemInfo> mem = backend_->GetMemInfo(device_);
  const std::size_t cached = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current -
                                                      stats_.active_bytes[kAllPools].current);
  return absl::StrFormat(
      "cma: out of memory on device %d: tried to allocate %s; device total %s, free %s; this "
      "allocator has %s reserved, %s allocated (%s requested), %s cached and %s managed budget; "
      "num_alloc_retries=%d num_ooms=%d; backend said: %s",
      device_, FormatBytes(bytes), FormatBytes(device_total_),
      mem.ok() ? FormatBytes(mem->free_bytes) : std::string("unknown"),
      FormatBytes(stats_.reserved_bytes[kAllPools].current),
      FormatBytes(stats_.allocated_bytes[kAllPools].current),
      FormatBytes(stats_.requested_bytes[kAllPools].current), FormatBytes(cached),
      FormatBytes(budget_), stats_.num_alloc_retries, stats_.num_ooms, cause.message());
}

}  // namespace cma
