#include "backends/cuda/cuda_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_status.h"

namespace cma {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Pair>
absl::StatusOr<double> Median(int reps, int per_rep, cudaStream_t stream, Pair&& pair) {
  absl::Status first = pair();  // warm-up: pools and contexts come up here
  if (!first.ok()) return first;
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  std::vector<double> samples;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < per_rep; ++i) {
      absl::Status s = pair();
      if (!s.ok()) return s;
    }
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                      per_rep);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

std::vector<std::string> CudaBaselineNames() {
  return {"managed_pair_ns", "managed_mempool_pair_ns", "async_device_pair_ns"};
}

absl::StatusOr<double> MeasureCudaBaseline(const std::string& name, int device, std::size_t bytes,
                                           int reps) {
  CMA_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  cudaStream_t stream;
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  absl::StatusOr<double> result;
  if (name == "managed_pair_ns") {
    result = Median(reps, bytes >= (std::size_t{64} << 20) ? 5 : 50, stream, [&]() {
      void* p;
      CMA_CUDA_RETURN_IF_ERROR(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal));
      CMA_CUDA_RETURN_IF_ERROR(cudaFree(p));
      return absl::OkStatus();
    });
  } else if (name == "managed_mempool_pair_ns") {
#if CUDART_VERSION >= 13000
    cudaMemPool_t pool;
    cudaMemLocation loc{};
    loc.type = cudaMemLocationTypeDevice;
    loc.id = device;
    const cudaError_t err = cudaMemGetDefaultMemPool(&pool, &loc, cudaMemAllocationTypeManaged);
    if (err != cudaSuccess) {
      result = CudaStatus(err, "cudaMemGetDefaultMemPool(managed)");
    } else {
      result = Median(reps, 2000, stream, [&]() {
        void* p;
        CMA_CUDA_RETURN_IF_ERROR(cudaMallocFromPoolAsync(&p, bytes, pool, stream));
        CMA_CUDA_RETURN_IF_ERROR(cudaFreeAsync(p, stream));
        return absl::OkStatus();
      });
    }
#else
    result = absl::UnimplementedError("managed memory pools need CUDA 13");
#endif
  } else if (name == "async_device_pair_ns") {
    result = Median(reps, 2000, stream, [&]() {
      void* p;
      CMA_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&p, bytes, stream));
      CMA_CUDA_RETURN_IF_ERROR(cudaFreeAsync(p, stream));
      return absl::OkStatus();
    });
  } else {
    result = absl::InvalidArgumentError(absl::StrCat("unknown CUDA baseline '", name, "'"));
  }
  cudaStreamDestroy(stream);
  return result;
}

}  // namespace cma
