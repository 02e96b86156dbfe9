// Blocks and segments: the bookkeeping units of the caching allocator.
//
// A Segment is one backend allocation. It is cut into a doubly linked list of
// Blocks that tile it exactly. Internal to allocator/; guarded by the owning
// DeviceAllocator's mutex.
#ifndef CMA_ALLOCATOR_BLOCK_H_
#define CMA_ALLOCATOR_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/inlined_vector.h"
#include "allocator/page_map.h"
#include "allocator/segment_source.h"
#include "backends/backend.h"
#include "policy/placement_policy.h"
#include "policy/size_policy.h"

namespace cma {

struct Segment;

struct Block {
  std::uintptr_t addr = 0;
  std::size_t size = 0;       // rounded size this block covers
  std::size_t requested = 0;  // what the caller asked for (0 when free)
  Stream stream = kDefaultStream;  // stream on which the block is safe to reuse at once
  Segment* segment = nullptr;
  Block* prev = nullptr;  // neighbours inside the segment
  Block* next = nullptr;
  bool allocated = false;
  // The private pool (allocator/mempool.h) the block belongs to; 0 for the
  // shared cache. Free blocks merge and serve requests only within theirs.
  std::uint32_t mempool = 0;
  // A block of a no_split pool (PyTorch's MemPool(no_split=True)): handed
  // out whole, never split nor merged with its neighbours while the pool
  // lives, so that it stays one segment of its own (what NCCL's buffer
  // registration of a pool's segments relies on).
  bool no_split = false;
  // Allocated blocks: the size class of the request (policy/size_policy.h
  // PoolFor), under which the allocation statistics count it; in an arena
  // it can differ from the segment's pool.
  PoolKind size_class = PoolKind::kSmall;
  // The contents may be thrown away while the owner sleeps (a KV cache):
  // set per allocation, cleared when it is freed.
  bool disposable = false;
  // The contents survive even a level-2 Sleep (SleepLevel::kDiscard), which
  // discards everything else: set per allocation, cleared when it is freed.
  bool keep = false;
  // Allocated blocks: Sleep discarded the whole pages inside (a
  // disposable block, or one whose contents it staged); they hold nothing
  // until Wake or a Move repopulates them, or the free forgets them.
  bool pages_discarded = false;
  // With pages_discarded: where the discarded whole pages start, 0 for the
  // block's start. A Move to the host brings back only the staged copy, so
  // the pages wholly beyond it (rounding past the request) stay discarded.
  std::uintptr_t discarded_from = 0;
  // Allocated blocks: a Sleep dropped the contents (a disposable block) and
  // nothing has written them since; only such a block may a Wake populate
  // without migrating (a Move, the caller's writes after it, a Wake clear
  // it).
  bool sleep_dropped = false;
  // Allocated blocks in an arena: SendAway prefetched the pages strictly
  // inside it (all but its first and last page, which neighbours may share)
  // to the host and the page map counts them as unpopulated, until
  // BringBack, a Move or a Sleep counts them again or the free discards
  // them (allocator/away.cc).
  bool away = false;
  // learn_step: the stream of the allocation's last reported use, which a
  // send away waits for (allocator/learn_step.cc).
  Stream used_on = kDefaultStream;
  // Allocated on the host tier because the caller routed it there (a
  // HostTier context: oversubscription's optimizer state), not because the
  // device's part was full: it never occupies the device, and the learned
  // step's plan counts it so.
  bool routed_to_host = false;
  int pending_events = 0;  // > 0 while freed but still used by other streams
  // Free blocks: when the block was last used, as DeviceAllocator's count of
  // frees; 0 when it has not been used since a moment its stream was known
  // idle, so that any stream may take it without asking the GPU.
  std::uint64_t free_seq = 0;
  // Freed but not yet merged with its free neighbours: merging is deferred
  // until a lookup misses, so a steady alloc/free cycle neither splits nor
  // merges.
  bool unmerged = false;
  // Streams other than `stream` that used the block (record_stream).
  absl::InlinedVector<Stream, 2> stream_uses;
  // Where this memory was last put (a prefetch or move target); unknown
  // until placed. A reused block already there needs no migration.
  bool placed = false;
  Location location;
  // Advice applied for the current allocation, withdrawn when it is freed.
  std::unique_ptr<AllocationHints> hints;

  void* ptr() const { return reinterpret_cast<void*>(addr); }
  bool is_split() const { return prev != nullptr || next != nullptr; }
  bool is_free() const { return !allocated && pending_events == 0; }
};

struct Segment {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  PoolKind pool = PoolKind::kSmall;
  Block* first = nullptr;
  // Arena mode (policy/config.h `segments:arena`): the segment is a large
  // address range whose kPageSize pages are populated on demand; a populated
  // page that no block in use touches is idle and may be discarded.
  bool arena = false;
  // A captured pool's arena: its idle pages are never discarded (a graph
  // replays into its free blocks), counted apart (pinned_idle_pages_).
  bool pinned = false;
  // Oversubscription's host tier (policy/oversubscription.h): the segment's
  // pages live on the host, mapped for the device; one block, never split.
  // Counted in host_resident_bytes, not reserved_bytes (device memory).
  bool host_tier = false;
  // A private pool's segment from another allocator (allocator/
  // segment_source.h), given back to it; null for the backend's managed
  // memory.
  std::shared_ptr<SegmentSource> source;
  // The private pool whose own segment this is (0: the shared cache's).
  // A pool's blocks lie only in its own segments, which never serve the
  // shared cache: released, the pool drains with them (mempool.cc).
  std::uint32_t owner_pool = 0;
  PageMap pages;

  // Whether the allocator places this memory (advice, prefetch, discard,
  // Sleep): managed memory on the device, not the host tier's nor another
  // allocator's.
  bool placeable() const { return !host_tier && source == nullptr; }

  std::size_t PageOf(std::uintptr_t addr) const { return (addr - base) / kPageSize; }

  void* ptr_base() const { return reinterpret_cast<void*>(base); }
};

// Free blocks ordered for best fit within a pool and stream: (private
// pool, stream, size, address); the shared cache (pool 0) comes first.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    return std::tie(a->mempool, a->stream, a->size, a->addr) <
           std::tie(b->mempool, b->stream, b->size, b->addr);
  }
};
using BlockPool = absl::btree_set<Block*, BlockOrder>;

}  // namespace cma

#endif  // CMA_ALLOCATOR_BLOCK_H_
