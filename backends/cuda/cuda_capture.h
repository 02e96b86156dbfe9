// The capture graph's topology as CUDA reports it, for reuse inside a
// capture (allocator/capture_reuse.h): where a capturing stream stands, and
// the nodes a node depends on. Both calls (cudaStreamGetCaptureInfo,
// cudaGraphNodeGetDependencies) are legal while capturing. Edge data is
// asked for and ignored: without it CUDA refuses (cudaErrorLossyQuery) a
// graph with programmatic edges. Before CUDA 12.3: no frontier (nullopt, so
// blocks freed in a capture wait for its end) and kUnimplemented.
//
// Thread safety: stateless. Errors: the CUDA call's, named.
#ifndef CMA_BACKENDS_CUDA_CUDA_CAPTURE_H_
#define CMA_BACKENDS_CUDA_CUDA_CAPTURE_H_

#include <cuda_runtime_api.h>

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace cma {

// nullopt when `stream` is not capturing.
absl::StatusOr<std::optional<CaptureFrontier>> CudaCaptureFrontier(cudaStream_t stream);
absl::StatusOr<std::vector<CaptureNode>> CudaCaptureNodeDependencies(CaptureNode node);

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_CUDA_CAPTURE_H_
