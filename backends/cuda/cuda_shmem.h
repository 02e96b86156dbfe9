// The CUDA backend's NVSHMEM symmetric heap (Backend::Shmem*), on NVSHMEM's
// host library loaded at run time (nvshmem_api.h), and its PeerCopy.
//
// NVSHMEM is initialised through nvshmemx_hostlib_init_attr with a unique
// id (NVSHMEMX_INIT_WITH_UNIQUEID): the symmetric heap hands PE 0's id to
// every PE over its own authenticated exchange, so no launcher, MPI or
// torch store is involved. Initialised once per process and never
// finalised (as torch does): NVSHMEM's finalize is collective, and a
// process may hold NVSHMEM memory until it exits. Each call is made with
// the PE's device current (the calling thread's device is restored).
// In a process where another library (torch) initialised NVSHMEM already,
// QueryState reports it, so that the heap can share it when its shape
// matches and refuse it clearly when not.
//
// Thread safety: every method may be called from any thread; the
// collectives are serialised here (NVSHMEM's heap calls are not
// thread-safe). Errors: the library's absence (kUnavailable) or missing
// entry points (kUnimplemented) on the first call, naming them; NVSHMEM's
// own failures as kInternal naming the call and its return code, except
// a null nvshmem_malloc, which is kResourceExhausted (NVSHMEM_SYMMETRIC_SIZE
// sets the heap's size).
#ifndef CMA_BACKENDS_CUDA_CUDA_SHMEM_H_
#define CMA_BACKENDS_CUDA_CUDA_SHMEM_H_

#include <cstddef>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"

namespace cma {

class CudaShmem {
 public:
  absl::StatusOr<Backend::ShmemState> QueryState();
  absl::StatusOr<std::string> UniqueId();
  absl::Status Init(const std::string& unique_id, int pe, int n_pes, int device);
  absl::StatusOr<void*> Malloc(std::size_t bytes);
  absl::Status Free(void* ptr);
  absl::StatusOr<void*> PeerPointer(void* ptr, int pe);
  absl::Status Put(void* dst, const void* src, std::size_t bytes, int pe, Stream stream);
  absl::Status Get(void* dst, const void* src, std::size_t bytes, int pe, Stream stream);
  absl::Status Quiet(Stream stream);

 private:
  absl::Mutex mu_;
  int device_ ABSL_GUARDED_BY(mu_) = -1;  // the PE's, once initialised here
};

// cudaMemcpyAsync(cudaMemcpyDefault) on `stream`.
absl::Status CudaPeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream);

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_CUDA_SHMEM_H_
