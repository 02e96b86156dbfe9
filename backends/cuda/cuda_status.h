// CUDA errors as absl::Status: the call's name, the error's name and its
// description. Out-of-memory maps to kResourceExhausted; bad values, devices
// and handles to kInvalidArgument; not-ready/unsupported to their codes.
#ifndef CMA_BACKENDS_CUDA_CUDA_STATUS_H_
#define CMA_BACKENDS_CUDA_CUDA_STATUS_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace cma {

absl::Status CudaStatus(cudaError_t err, const char* call);
absl::Status CuStatus(CUresult err, const char* call);

}  // namespace cma

#define CMA_CUDA_RETURN_IF_ERROR(expr)                         \
  do {                                                         \
    const cudaError_t cma_err_ = (expr);                       \
    if (cma_err_ != cudaSuccess) return ::cma::CudaStatus(cma_err_, #expr); \
  } while (0)

#endif  // CMA_BACKENDS_CUDA_CUDA_STATUS_H_
