// Size classes of the host pool (allocator/host_pool.h): CPU-side
// allocations (PyTorch's CPU tensors under cma.torch's managed switch).
//
// Pure functions of their arguments: no locks, no backend calls.
//
// Small requests round to a power of two from 512 B to 1 MiB and are carved,
// many to a slab, from 2 MiB slabs: CPU code makes many tiny tensors, and a
// managed allocation each would cost a driver call and a page each. Larger
// requests round to whole 2 MiB pages, the unit managed memory migrates in,
// and get a segment of their own, so that moving one to a GPU moves nothing
// of another's.
#ifndef CMA_POLICY_HOST_SIZE_CLASS_H_
#define CMA_POLICY_HOST_SIZE_CLASS_H_

#include <cstddef>

namespace cma {

inline constexpr std::size_t kHostSlabSize = std::size_t{2} << 20;
inline constexpr std::size_t kHostMinChunk = 512;
inline constexpr std::size_t kHostMaxChunk = std::size_t{1} << 20;
inline constexpr int kHostChunkClasses = 12;  // 512 B, 1 KiB, ..., 1 MiB

// The size a request is rounded to (0 for 0, and for sizes so large that
// rounding would overflow: the caller refuses those).
std::size_t HostRound(std::size_t bytes);

// The chunk class (0 for 512 B ... 11 for 1 MiB) of a rounded size, or -1
// for a size served by a segment of its own.
int HostChunkClass(std::size_t rounded);

// Whether a cached segment of `segment_size` may serve a rounded request of
// `rounded` bytes: it wastes at most an eighth of the request (and never
// less than an exact fit is refused).
bool HostSegmentCanServe(std::size_t segment_size, std::size_t rounded);

}  // namespace cma

#endif  // CMA_POLICY_HOST_SIZE_CLASS_H_
