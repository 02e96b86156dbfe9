// Private memory pools (PyTorch's MemPool and CUDA graph pools).
//
// While a pool is being allocated to (DeviceAllocator::BeginAllocateToPool),
// allocations from the streams its filter accepts come from that pool: it
// grows by segments of its own, whose blocks serve no one else. A pool
// lives while its use count is above zero or it holds allocations; then it
// drains: known by its id, its segments serving no one, until they are
// given back with the cache's memory.
//
// Thread safety: plain value types; the allocator guards its pools.
#ifndef CMA_ALLOCATOR_MEMPOOL_H_
#define CMA_ALLOCATOR_MEMPOOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "allocator/segment_source.h"
#include "backends/backend.h"

namespace cma {

// A pool's identity, as PyTorch's MempoolId_t: chosen by the caller.
using MemPoolId = std::pair<std::uint64_t, std::uint64_t>;

// Whether an allocation on `stream` goes to the pool being allocated to.
// Called under the allocator's lock: it must not call back into it.
using StreamFilter = std::function<bool(Stream)>;

// How a pool context treats what is freed while it is open.
struct PoolContextOptions {
  // PyTorch's graph_capture_record_stream_reuse: a block of the pool freed
  // during a CUDA graph capture while other streams used it (RecordStream)
  // may serve the pool again inside the same capture, once the allocating
  // stream's captured work depends on every use (allocator/capture_reuse.h),
  // rather than only after the last context ends. Needs a backend that
  // reports capture topology (CUDA 12.3+; the host backend's emulation).
  bool reuse_after_join = false;
  // The caller knows no CUDA graph is captured through this context (PyTorch's
  // use_mem_pool, begun on a stream that is not capturing). Such a context
  // leaves the allocator active (it populates, prefetches, discards and
  // releases as without it), and a pool never allocated to by any other
  // kind of context grows, in arena mode, by arenas of its own whose idle
  // pages are given back as the shared cache's are. A capture begins a
  // context of its own (PyTorch's capture_begin does), which is quiet.
  bool not_a_capture = false;
};

// What a pool does besides holding its blocks (PyTorch's MemPool(no_split=,
// use_on_oom=)). Set once a pool is known (after CreateOrIncrefPool), before
// it is allocated to; they apply to what is handed out afterwards.
struct PoolOptions {
  // Blocks are handed out whole and never split nor merged while the pool
  // lives: each allocation is one segment of its own (as PyTorch's, whose
  // segments are the segment size of the request: 2 MiB up to 1 MiB, 20 MiB
  // up to 10 MiB, else the request rounded to 2 MiB).
  bool no_split = false;
  // When an allocation anywhere else on the device runs out of memory, a
  // free block of this pool (on the allocation's stream) that fits serves
  // it, as this pool's block, while the pool holds a reference.
  bool use_on_oom = false;
};

// One allocation of a private pool: its address, its block's (rounded)
// size, the size it was requested with, and its stream.
struct PoolAllocation {
  void* ptr = nullptr;
  std::size_t size = 0;
  std::size_t requested = 0;
  Stream stream = kDefaultStream;
};

// A pool's live allocations at one moment (PyTorch's PrivatePoolState, which
// torch.compile's cudagraph trees take after recording a graph and restore
// before recording the next one from the same point of the tree).
struct PoolCheckpoint {
  int device = 0;
  MemPoolId pool{0, 0};
  std::vector<PoolAllocation> allocations;  // by address
};

// What a restore did. As in PyTorch, every allocation live in the pool
// before is in `freed` (its owner must not free it), every allocation of
// the checkpoint in `created` (its new owner frees it); those in both with
// the same address and size never moved (`kept` lists their addresses).
struct PoolRestoreResult {
  std::vector<PoolAllocation> freed;
  std::vector<PoolAllocation> created;
  std::vector<void*> kept;
};

// DeviceAllocator's record of one private pool, and of one context that
// routes allocations to it (internal to allocator/, under its mutex).
struct PrivatePoolState {
  MemPoolId id;
  int use_count = 0;
  std::size_t live = 0;     // blocks handed out and not yet free again
  bool no_split = false;    // PoolOptions
  bool use_on_oom = false;
  std::shared_ptr<SegmentSource> source;  // null: the backend's managed memory
  std::size_t segments = 0;  // its own segments held (Segment::owner_pool), its blocks' only home
  // A context that may be a capture has allocated to it: a graph may replay
  // into its free blocks, so their pages stay populated for good.
  bool captured = false;
};
struct PoolContextState {
  std::uint32_t index;
  StreamFilter filter;
  PoolContextOptions options;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_MEMPOOL_H_
