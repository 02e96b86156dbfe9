// DeviceAllocator's pool queries and checkpoints: PyTorch's getPoolUseCount,
// emptyCache(mempool_id), getCheckpointState and setCheckpointPoolState.
//
// torch.compile's cudagraph trees record a tree of graphs into one pool.
// After recording a graph they checkpoint the pool's live allocations; to
// record a new branch after replaying its parent, they restore the parent's
// checkpoint, so that the allocator knows which memory the replayed
// parent's outputs occupy. A restore re-creates those allocations at their
// addresses by carving them out of the pool's free blocks: the memory holds
// what the replay wrote, so nothing is placed, prefetched or discarded.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

// Whether `cp` is a checkpoint this device could have taken, checked whole
// before a restore changes anything: every allocation inside one segment of
// the device, aligned and sized as blocks are, at least its rounded request,
// in the kind of segment its request is served from, on a stream of the
// device, and none overlapping another. A hand-made or corrupted checkpoint
// would otherwise carve blocks that break the allocator's layout for good
// (a 1000-byte block leaves every later block carved after it misaligned).
// `wanted` is cp.allocations by address.
absl::Status ValidateCheckpoint(const PoolCheckpoint& cp, const std::vector<PoolAllocation>& wanted,
                                const AllocatorConfig& config, std::size_t device_total,
                                absl::FunctionRef<const Segment*(std::uintptr_t)> segment_at,
                                absl::FunctionRef<absl::Status(Stream)> check_stream) {
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    const PoolAllocation& a = wanted[i];
    const auto addr = reinterpret_cast<std::uintptr_t>(a.ptr);
    const auto malformed = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "cma: the checkpoint of pool (%d, %d) of device %d is malformed: its allocation at %p "
          "(%d bytes, %d requested) %s",
          cp.pool.first, cp.pool.second, cp.device, a.ptr, a.size, a.requested, why));
    };
    if (a.size == 0) return malformed("is empty");
    if (a.requested == 0) return malformed("was requested with 0 bytes");
    if (a.size > device_total) {
      return malformed(absl::StrFormat("is larger than the device (%d bytes)", device_total));
    }
    if (addr == 0 || addr > UINTPTR_MAX - a.size) return malformed("is not a valid range");
    const Segment* seg = segment_at(addr);
    if (seg == nullptr || addr + a.size > seg->base + seg->size) {
      return malformed("is not inside one segment of this device");
    }
    if (i > 0) {
      const PoolAllocation& prev = wanted[i - 1];
      if (reinterpret_cast<std::uintptr_t>(prev.ptr) + prev.size > addr) {
        return malformed(absl::StrFormat("overlaps the allocation at %p", prev.ptr));
      }
    }
    // Blocks lie at multiples of the block size from their segment's base
    // (another allocator's segment may start at any 256-byte boundary).
    if ((addr - seg->base) % kMinBlockSize != 0) {
      return malformed(absl::StrFormat("is not aligned to %d bytes within its segment",
                                       kMinBlockSize));
    }
    if (a.size % kMinBlockSize != 0) {
      return malformed(absl::StrFormat("has a size that is not a multiple of %d bytes",
                                       kMinBlockSize));
    }
    // The plain rounding, the least any setting gives: roundup_power2_divisions
    // may have changed since the checkpoint was taken.
    const std::size_t rounded = RoundRequest(a.requested, AllocatorConfig{});
    if (a.size < rounded) {
      return malformed(absl::StrFormat("is smaller than its request rounded (%d bytes)", rounded));
    }
    // Arenas are the shared cache's; other segments are pools' own.
    if (seg->pool != LookupPoolFor(rounded, /*private_pool=*/!seg->arena, config)) {
      return malformed(absl::StrFormat(
          "lies in a %s-block segment, which never serves a request of that size",
          seg->pool == PoolKind::kSmall ? "small" : "large"));
    }
    if (absl::Status s = check_stream(a.stream); !s.ok()) {
      return malformed(absl::StrFormat("is on a stream this device cannot use (%s)", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> DeviceAllocator::GetPoolUseCount(MemPoolId id) {
  MutexLock l(&mu_);
  auto known = mempool_index_.find(id);
  if (known == mempool_index_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: pool (%d, %d) of device %d does not exist", id.first, id.second, device_));
  }
  return mempools_[known->second].use_count;
}

absl::Status DeviceAllocator::EmptyPoolCache(MemPoolId id) {
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("empty_cache of a pool"); !s.ok()) return s;
  auto known = mempool_index_.find(id);
  // Unknown: never made, or its segments have all gone back; PyTorch has
  // nothing to free then either.
  if (known == mempool_index_.end()) return absl::OkStatus();
  const std::uint32_t index = known->second;
  // Referenced: a graph may replay into its free blocks.
  if (mempools_[index].use_count > 0) return absl::OkStatus();
  ProcessPendingFrees(/*synchronize=*/true);
  CoalesceUnmerged();
  // (Under learn_step, after the learned transfers, and discarded: the user
  // asked for it; see DiscardDead.)
  if (arena_mode() && SettleLearnedTransfers()) {
    release_asked_ = true;
    std::vector<Block*> blocks;
    for (BlockPool* pool : {&small_pool_, &large_pool_}) {
      Block key;
      key.mempool = index;
      for (auto b = pool->lower_bound(&key); b != pool->end() && (*b)->mempool == index; ++b) {
        if ((*b)->segment->arena) blocks.push_back(*b);
      }
    }
    for (Block* b : blocks) {
      DiscardPagesInside(b, /*already_discarded=*/false, /*pool_too=*/true);
      // Used again as of the discard queued on its stream: no stream may
      // take it later on the strength of an older idle mark (see
      // DiscardIdlePages).
      b->free_seq = ++free_seq_;
    }
    release_asked_ = false;
  }
  ReleaseIdleSegments(0, index);
  return absl::OkStatus();
}

absl::StatusOr<std::uint32_t> DeviceAllocator::ReferencedPool(MemPoolId id, const char* what) {
  auto known = mempool_index_.find(id);
  if (known == mempool_index_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: %s of pool (%d, %d) of device %d, which does not exist", what, id.first, id.second,
        device_));
  }
  if (mempools_[known->second].use_count <= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: %s of pool (%d, %d) of device %d, which holds no reference (released: its "
        "allocations are no graph's any more)",
        what, id.first, id.second, device_));
  }
  return known->second;
}

absl::StatusOr<PoolCheckpoint> DeviceAllocator::TakePoolCheckpoint(MemPoolId id) {
  MutexLock l(&mu_);
  absl::StatusOr<std::uint32_t> index = ReferencedPool(id, "checkpoint");
  if (!index.ok()) return index.status();
  PoolCheckpoint cp;
  cp.device = device_;
  cp.pool = id;
  for (const auto& [addr, b] : allocated_) {
    if (b->mempool != *index) continue;
    cp.allocations.push_back({b->ptr(), b->size, b->requested, b->stream});
  }
  std::sort(cp.allocations.begin(), cp.allocations.end(),
            [](const PoolAllocation& a, const PoolAllocation& b) { return a.ptr < b.ptr; });
  return cp;
}

Segment* DeviceAllocator::SegmentAt(std::uintptr_t addr) {
  auto it = segments_.upper_bound(addr);
  if (it == segments_.begin()) return nullptr;
  Segment* seg = std::prev(it)->second;
  return addr < seg->base + seg->size ? seg : nullptr;
}

absl::Status DeviceAllocator::CheckCarvable(
    std::uint32_t index, std::uintptr_t addr, std::size_t size,
    const absl::flat_hash_set<const Block*>& freeing,
    absl::flat_hash_set<std::pair<const Segment*, std::size_t>>* fresh) {
  const std::uintptr_t end = addr + size;
  const Segment* seg = SegmentAt(addr);
  const auto refuse = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: cannot restore the allocation at %#x (%d bytes) of a pool of device %d: %s", addr,
        size, device_, why));
  };
  if (seg == nullptr || end > seg->base + seg->size || end <= addr) {
    return refuse("the range is not inside one segment of this device");
  }
  for (const Block* b = seg->first; b != nullptr && b->addr < end; b = b->next) {
    if (b->addr + b->size <= addr) continue;
    if (b->is_free()) {
      if (b->mempool != index) {
        return refuse(absl::StrFormat("the free block at %#x is not this pool's", b->addr));
      }
    } else if (freeing.contains(b)) {
      if (!b->stream_uses.empty() || b->pages_discarded) {
        return refuse(absl::StrFormat(
            "the allocation at %#x to be freed there is still used by another stream "
            "(record_stream) or asleep", b->addr));
      }
    } else {
      return refuse(absl::StrFormat("the block at %#x is in use (%s)", b->addr,
                                    b->allocated ? "allocated" : "freed, awaiting its streams"));
    }
  }
  if (seg->arena) {
    const std::size_t first = seg->PageOf(addr), last = seg->PageOf(end - 1);
    for (std::size_t p = first; p <= last; ++p) {
      if (!seg->pages.populated(p)) fresh->insert({seg, p});
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PoolRestoreResult> DeviceAllocator::RestorePoolCheckpoint(
    const PoolCheckpoint& cp) {
  MutexLock l(&mu_);
  if (absl::Status s = RefuseWhileQuiet("restore of a pool checkpoint"); !s.ok()) return s;
  absl::StatusOr<std::uint32_t> found = ReferencedPool(cp.pool, "restore of a checkpoint");
  if (!found.ok()) return found.status();
  const std::uint32_t index = *found;

  // ---- plan: nothing changes until every check has passed ----
  std::vector<PoolAllocation> wanted = cp.allocations;
  std::sort(wanted.begin(), wanted.end(),
            [](const PoolAllocation& a, const PoolAllocation& b) { return a.ptr < b.ptr; });
  if (absl::Status s = ValidateCheckpoint(
          cp, wanted, *config_, device_total_,
          [this](std::uintptr_t addr) ABSL_NO_THREAD_SAFETY_ANALYSIS { return SegmentAt(addr); },
          [this](Stream stream) ABSL_NO_THREAD_SAFETY_ANALYSIS { return CheckStream(stream); });
      !s.ok()) {
    return s;
  }
  // Frees whose streams have finished count as free for the plan.
  if (!pending_.empty()) ProcessPendingFrees(/*synchronize=*/false);
  PoolRestoreResult result;
  absl::flat_hash_map<std::uintptr_t, Block*> live;  // the pool's allocations now
  for (const auto& [addr, b] : allocated_) {
    if (b->mempool == index) live[addr] = b;
  }
  absl::flat_hash_set<const Block*> freeing;
  std::vector<Block*> keep;  // parallel to the kept entries of `wanted`
  std::vector<const PoolAllocation*> kept_as, carve;
  for (const PoolAllocation& a : wanted) {
    auto it = live.find(reinterpret_cast<std::uintptr_t>(a.ptr));
    if (it != live.end() && it->second->size == a.size) {
      keep.push_back(it->second);
      kept_as.push_back(&a);
      continue;
    }
    carve.push_back(&a);
  }
  for (const auto& [addr, b] : live) {
    if (std::find(keep.begin(), keep.end(), b) == keep.end()) freeing.insert(b);
  }
  absl::flat_hash_set<std::pair<const Segment*, std::size_t>> fresh;
  for (const PoolAllocation* a : carve) {
    if (absl::Status s = CheckCarvable(index, reinterpret_cast<std::uintptr_t>(a->ptr), a->size,
                                       freeing, &fresh);
        !s.ok()) {
      return s;
    }
  }
  if (!fresh.empty() && populated_pages() + fresh.size() > budget_ / kPageSize) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cma: restoring the checkpoint of pool (%d, %d) would populate %d pages beyond the "
        "managed budget of device %d", cp.pool.first, cp.pool.second,
        populated_pages() + fresh.size() - budget_ / kPageSize, device_));
  }

  // ---- apply ----
  for (const auto& [addr, b] : live) {
    result.freed.push_back({b->ptr(), b->size, b->requested, b->stream});
  }
  std::sort(result.freed.begin(), result.freed.end(),
            [](const PoolAllocation& a, const PoolAllocation& b) { return a.ptr < b.ptr; });
  for (const Block* b : freeing) FreeForRestore(const_cast<Block*>(b));
  for (std::size_t i = 0; i < keep.size(); ++i) {
    Block* b = keep[i];
    const PoolAllocation& a = *kept_as[i];
    UpdateStat(stats_.requested_bytes, b->size_class,
               static_cast<std::int64_t>(a.requested) - static_cast<std::int64_t>(b->requested));
    b->requested = a.requested;
    if (a.stream != b->stream) {
      // Work queued on the old stream may still use it: its free waits for that too.
      if (std::find(b->stream_uses.begin(), b->stream_uses.end(), b->stream) ==
          b->stream_uses.end()) {
        b->stream_uses.push_back(b->stream);
      }
      b->stream_uses.erase(std::remove(b->stream_uses.begin(), b->stream_uses.end(), a.stream),
                           b->stream_uses.end());
      b->stream = a.stream;
    }
    result.kept.push_back(b->ptr());
  }
  CoalesceUnmerged();
  for (const PoolAllocation* a : carve) Carve(index, *a);
  result.created = std::move(wanted);
  return result;
}

void DeviceAllocator::FreeForRestore(Block* b) {
  allocated_.erase(b->addr);
  if (ABSL_PREDICT_FALSE(iteration_.recording)) RecordFree(b->addr);
  // Its contents in a Sleep's staging are not to be copied back over
  // whatever the restore puts there.
  if (ABSL_PREDICT_FALSE(!staged_.empty())) Unstage(b->addr);
  if (b->hints) {
    ApplyAdvice(WithdrawHintAdvice(*b->hints), b->ptr(), b->size);
    b->hints.reset();
  }
  CountFreed(b);
  // As Free: an event on each other stream that used it. (A stream that
  // can be neither fenced nor waited for is counted, not waited: a restore
  // cannot stop halfway.)
  if (!FenceStreamUses(b)) b->stream_uses.clear();
  if (b->pending_events == 0) BecameFree(b);
}

Block* DeviceAllocator::SplitFree(Block* b, std::uintptr_t at) {
  EraseFree(b);  // counted out of inactive_split as it was
  Block* upper = SplitAt(b, at);
  ReturnBlock(b);
  ReturnBlock(upper);
  return upper;
}

void DeviceAllocator::Carve(std::uint32_t index, const PoolAllocation& a) {
  const auto addr = reinterpret_cast<std::uintptr_t>(a.ptr);
  const std::uintptr_t end = addr + a.size;
  Segment* seg = SegmentAt(addr);
  Block* b = seg->first;
  while (b->addr + b->size <= addr) b = b->next;
  if (b->addr < addr) b = SplitFree(b, addr);
  Block* last = b;
  while (last->addr + last->size < end) last = last->next;
  if (last->addr + last->size > end) SplitFree(last, end);
  // One block over the range, owned by the checkpoint's stream: work on it
  // waits (on the GPU) for the streams that last used each piece.
  EraseFree(b);
  absl::flat_hash_set<Stream> ordered = {a.stream};
  if (ordered.insert(b->stream).second) (void)OrderAfter(a.stream, b->stream);
  while (b->addr + b->size < end) {
    if (ordered.insert(b->next->stream).second) (void)OrderAfter(a.stream, b->next->stream);
    AbsorbNext(b);
  }
  b->mempool = index;
  HandOut(b, a.size, a.requested, seg->pool, a.stream, index);
  populate_.clear();  // the replay's data is there: no placement
}

}  // namespace cma
