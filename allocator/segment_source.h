// Where a private pool's segments come from when they are not the backend's
// managed memory: another allocator's device memory (PyTorch's
// MemPool(allocator=...), NCCL's allocator for registered buffers). Such a
// pool is served by the same caching engine as every other pool: its
// segments are split, merged, cached per stream, counted in `segment.*` and
// `reserved_bytes.*`, charged to the budget, and given back (Free) only when
// cached memory is and the pool no longer holds a reference.
//
// The memory is not managed memory, so the allocator never places it: no
// advice, prefetch, discard or migration; Sleep and Wake leave it where it
// is, and Move and SetHints refuse it.
//
// Ownership: every segment a source made holds a reference to it, and so
// does its pool; the source is destroyed once the pool is gone and its last
// segment given back.
// Thread safety: Allocate and Free are called with the device allocator's
// lock held, one call at a time per device; they must not call back into
// the allocator for that device.
#ifndef CMA_ALLOCATOR_SEGMENT_SOURCE_H_
#define CMA_ALLOCATOR_SEGMENT_SOURCE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace cma {

class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // `bytes` of memory of `device` usable on `stream`. kResourceExhausted
  // when out of memory (the allocation then fails as an out-of-memory one);
  // any other error is handed to the caller as it is.
  virtual absl::StatusOr<void*> Allocate(int device, std::size_t bytes, Stream stream) = 0;
  // Gives back what Allocate returned (`bytes` as asked). On an error the
  // segment stays cached and is offered again at the next release.
  virtual absl::Status Free(int device, void* ptr, std::size_t bytes) = 0;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_SEGMENT_SOURCE_H_
