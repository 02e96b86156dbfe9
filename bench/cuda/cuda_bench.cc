#include "bench/cuda/cuda_bench.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_status.h"
#include "bench/cuda/kernels.h"

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

absl::StatusOr<PeerBandwidth> MeasurePeerBandwidth(void* peer, std::size_t bytes, int writer,
                                                   int owner) {
  PeerBandwidth out;
  CMA_CUDA_RETURN_IF_ERROR(cudaSetDevice(writer));
  cudaStream_t s;
  CMA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* src = nullptr;
  void* dst = nullptr;
  absl::Status st = CudaStatus(cudaMalloc(&src, bytes), "cudaMalloc(writer)");
  if (st.ok()) st = CudaStatus(cudaSetDevice(owner), "cudaSetDevice");
  if (st.ok()) st = CudaStatus(cudaMalloc(&dst, bytes), "cudaMalloc(owner)");
  if (st.ok()) st = CudaStatus(cudaSetDevice(writer), "cudaSetDevice");
  // cudaMemcpyPeer goes through the host unless peer access is enabled: the
  // fair baseline is the direct NVLink/PCIe copy.
  if (st.ok()) {
    const cudaError_t e = cudaDeviceEnablePeerAccess(owner, 0);
    if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
      st = CudaStatus(e, "cudaDeviceEnablePeerAccess");
    }
    cudaGetLastError();  // clear an "already enabled"
  }
  auto best_of = [&](auto&& op) -> absl::StatusOr<double> {
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      if (absl::Status x = op(); !x.ok()) return x;
      CMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
      t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return static_cast<double>(bytes) / t[t.size() / 2] / 1e9;
  };
  if (st.ok()) {
    (void)LaunchFill(peer, bytes, 1, reinterpret_cast<Stream>(s));  // warm-up
    auto w = best_of([&] { return LaunchFill(peer, bytes, 2, reinterpret_cast<Stream>(s)); });
    auto m = best_of([&] {
      return CudaStatus(cudaMemcpyPeerAsync(dst, owner, src, writer, bytes, s), "cudaMemcpyPeerAsync");
    });
    if (!w.ok()) st = w.status();
    if (!m.ok()) st = m.status();
    if (st.ok()) {
      out.peer_write_GBps = *w;
      out.memcpy_peer_GBps = *m;
    }
  }
  cudaFree(src);
  cudaFree(dst);
  cudaStreamDestroy(s);
  if (!st.ok()) return st;
  return out;
}

}  // namespace cma
