// The CUDA backend's pinned host memory (the sleep staging's chunks).
//
// Pinning is what makes a first sleep slow (vLLM's pinned backups take
// seconds): the kernel must populate and zero every host page, then the
// driver locks and maps them. Populating in parallel (several threads fault
// in disjoint parts, on huge pages where the kernel gives them) and then
// registering the populated range is faster than cudaHostAlloc's one
// thread; where registering fails, cudaHostAlloc. Before CUDA 13 there is no
// discard, so a staged sleep would free nothing: Allocate then refuses.
//
// Thread safety: Allocate and Free may be called concurrently (the sleep
// pins several chunks at once, allocator/chunk_pinner.h); concurrent calls
// share the host's cores. Ownership: a buffer Allocate returned is the
// caller's until Free. Errors: the CUDA call's, named.
#ifndef CMA_BACKENDS_CUDA_CUDA_PINNED_H_
#define CMA_BACKENDS_CUDA_CUDA_PINNED_H_

#include <atomic>
#include <cstddef>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace cma {

class CudaPinnedHost {
 public:
  absl::StatusOr<void*> Allocate(std::size_t bytes);
  // Waits for the device's queued work first (unregistering, unlike
  // cudaFreeHost, would not wait for copies still using the buffer).
  absl::Status Free(void* ptr);

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<void*, std::size_t> registered_ ABSL_GUARDED_BY(mu_);  // mmap'd, length
  std::atomic<int> in_flight_{0};  // Allocate calls running now
};

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_CUDA_PINNED_H_
