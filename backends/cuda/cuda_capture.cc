#include "backends/cuda/cuda_capture.h"

#include "backends/cuda/cuda_status.h"

namespace cma {

absl::StatusOr<std::optional<CaptureFrontier>> CudaCaptureFrontier(cudaStream_t stream) {
#if CUDART_VERSION >= 12030
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  std::size_t n = 0;
#if CUDART_VERSION >= 13000
  CMA_CUDA_RETURN_IF_ERROR(
      cudaStreamGetCaptureInfo(stream, &status, &id, &graph, &deps, &edges, &n));
#else
  CMA_CUDA_RETURN_IF_ERROR(
      cudaStreamGetCaptureInfo_v3(stream, &status, &id, &graph, &deps, &edges, &n));
#endif
  if (status != cudaStreamCaptureStatusActive) return std::nullopt;
  CaptureFrontier f{id, {}};
  for (std::size_t i = 0; i < n; ++i) f.nodes.push_back(reinterpret_cast<CaptureNode>(deps[i]));
  return f;
#else
  (void)stream;
  return std::nullopt;  // blocks freed in a capture wait for its end
#endif
}

absl::StatusOr<std::vector<CaptureNode>> CudaCaptureNodeDependencies(CaptureNode node) {
#if CUDART_VERSION >= 12030
  auto* n = reinterpret_cast<cudaGraphNode_t>(node);
  std::size_t count = 0;
#if CUDART_VERSION >= 13000
  CMA_CUDA_RETURN_IF_ERROR(cudaGraphNodeGetDependencies(n, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> deps(count);
  std::vector<cudaGraphEdgeData> edges(count);
  if (count > 0) {
    CMA_CUDA_RETURN_IF_ERROR(cudaGraphNodeGetDependencies(n, deps.data(), edges.data(), &count));
  }
#else
  CMA_CUDA_RETURN_IF_ERROR(cudaGraphNodeGetDependencies_v2(n, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> deps(count);
  std::vector<cudaGraphEdgeData> edges(count);
  if (count > 0) {
    CMA_CUDA_RETURN_IF_ERROR(
        cudaGraphNodeGetDependencies_v2(n, deps.data(), edges.data(), &count));
  }
#endif
  std::vector<CaptureNode> out;
  for (std::size_t i = 0; i < count && i < deps.size(); ++i) {
    out.push_back(reinterpret_cast<CaptureNode>(deps[i]));
  }
  return out;
#else
  (void)node;
  return absl::UnimplementedError("CaptureNodeDependencies needs CUDA 12.3");
#endif
}

}  // namespace cma
