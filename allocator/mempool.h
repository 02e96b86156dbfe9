// Private memory pools (PyTorch's MemPool and CUDA graph pools).
//
// While a pool is being allocated to (DeviceAllocator::BeginAllocateToPool),
// allocations from the streams its filter accepts come from that pool: its
// free blocks serve no one else, and the shared cache only lends it space,
// which becomes the pool's for good once handed out. A pool lives while its
// use count is above zero or it holds allocations; then its free blocks go
// back to the shared cache, where they merge with their neighbours.
//
// Thread safety: plain value types; the allocator guards its pools.
#ifndef CMA_ALLOCATOR_MEMPOOL_H_
#define CMA_ALLOCATOR_MEMPOOL_H_

#include <cstdint>
#include <functional>
#include <utility>

#include "backends/backend.h"

namespace cma {

// A pool's identity, as PyTorch's MempoolId_t: chosen by the caller.
using MemPoolId = std::pair<std::uint64_t, std::uint64_t>;

// Whether an allocation on `stream` goes to the pool being allocated to.
// Called under the allocator's lock: it must not call back into it.
using StreamFilter = std::function<bool(Stream)>;

}  // namespace cma

#endif  // CMA_ALLOCATOR_MEMPOOL_H_
