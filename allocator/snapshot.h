// A point-in-time copy of every segment and block, for debugging and for
// tools (the memory_snapshot of PyTorch, in this library's terms).
#ifndef CMA_ALLOCATOR_SNAPSHOT_H_
#define CMA_ALLOCATOR_SNAPSHOT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/mempool.h"
#include "backends/backend.h"

namespace cma {

struct BlockSnapshot {
  std::uintptr_t address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  // "active_allocated", "active_pending_free" (awaiting other streams) or "inactive".
  std::string state;
  Stream stream = kDefaultStream;
  std::string location;  // last placement: "device N", "host" or "unplaced"
  MemPoolId pool{0, 0};  // the private pool it belongs to; {0, 0}: the shared cache
  // In an arena: bytes from the block's start to the end of its last
  // populated page (0: none is populated; a free block holding memory has
  // more). A classic segment's blocks: their size.
  std::size_t populated_end = 0;
  // A no_split pool's block: a segment of its own in PyTorch's terms.
  bool own_segment = false;
  // A live allocation sent away (allocator/away.cc): the pages strictly
  // inside it wait on the host, not counted in populated_end's pages.
  bool away = false;
};

struct SegmentSnapshot {
  int device = 0;
  std::uintptr_t address = 0;
  std::size_t total_size = 0;
  std::size_t allocated_size = 0;
  std::size_t requested_size = 0;
  std::string segment_type;  // "small" or "large"
  // An arena is address space: total_size is its range, populated_bytes the
  // physical part (the whole segment for a classic one).
  bool is_arena = false;
  std::size_t populated_bytes = 0;
  // Oversubscription's host tier: the pages live on the host (none of the
  // device's: populated_bytes is 0).
  bool on_host = false;
  // In address order. Free neighbours that a merge would join (same stream
  // and pool, no segment of their own) appear as one block, as PyTorch's
  // allocator, which merges on free, shows them; the allocator may still
  // hold them apart until it coalesces.
  std::vector<BlockSnapshot> blocks;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_SNAPSHOT_H_
