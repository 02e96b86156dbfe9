// CudaBackend: the Backend interface on the CUDA runtime (managed memory,
// placement, streams, events) and driver API (VMM, device facts).
//
// Requires CUDA 12.8 or newer to build (cudaStreamGetDevice,
// cudaGetDriverEntryPointByVersion); CUDA 13's cudaMemLocation forms and batch
// prefetch/discard calls are used when CUDART_VERSION >= 13000, and the
// equivalent per-range calls otherwise. Multicast is refused whenever
// CMA_DISABLE_MULTICAST=1, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 or
// NCCL_NVLS_ENABLE=0 is set, whatever the caller asks.
//
// Thread safety: all methods are safe to call concurrently. The calling
// thread's current device is restored after every call that switches it.
#ifndef CMA_BACKENDS_CUDA_CUDA_BACKEND_H_
#define CMA_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace cma {

// kUnavailable when no CUDA device is visible (with the runtime's reason).
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend();

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_CUDA_BACKEND_H_
