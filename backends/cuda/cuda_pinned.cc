#include "backends/cuda/cuda_pinned.h"

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_status.h"
#include "backends/mutex_lock.h"

namespace cma {

absl::StatusOr<void*> CudaPinnedHost::Allocate(std::size_t bytes) {
#if CUDART_VERSION >= 13000
  if (bytes == 0) return absl::InvalidArgumentError("AllocatePinnedHost: size 0");
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t len = (bytes + kHuge - 1) / kHuge * kHuge;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p != MAP_FAILED) {
    (void)madvise(p, len, MADV_HUGEPAGE);
    // Several chunks are pinned at once (allocator/chunk_pinner.h): the
    // host's cores are shared among the calls in flight.
    struct InFlight {
      explicit InFlight(std::atomic<int>& n) : n(n), now(n.fetch_add(1) + 1) {}
      ~InFlight() { n.fetch_sub(1); }
      std::atomic<int>& n;
      const int now;
    } in_flight(in_flight_);
    const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
    const unsigned threads = static_cast<unsigned>(std::clamp<std::size_t>(
        std::min<std::size_t>(len / (16 << 20), cores / static_cast<std::size_t>(in_flight.now)),
        1, 16));
    std::vector<std::thread> touch;
    const std::size_t part = (len / threads + kHuge - 1) / kHuge * kHuge;
    for (unsigned t = 0; t < threads; ++t) {
      touch.emplace_back([p, len, part, t] {
        auto* c = static_cast<volatile char*>(p);
        for (std::size_t o = t * part; o < std::min(len, (t + 1) * part); o += 4096) c[o] = 0;
      });
    }
    for (std::thread& t : touch) t.join();
    if (cudaHostRegister(p, len, cudaHostRegisterDefault) == cudaSuccess) {
      MutexLock l(&mu_);
      registered_[p] = len;
      return p;
    }
    (void)cudaGetLastError();
    munmap(p, len);
  }
  void* q = nullptr;
  CMA_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&q, bytes, cudaHostAllocDefault));
  return q;
#else
  (void)bytes;
  // Before CUDA 13 there is no discard: a staged sleep would free nothing.
  return absl::UnimplementedError("sleep staging needs CUDA 13's discard");
#endif
}

absl::Status CudaPinnedHost::Free(void* ptr) {
  std::size_t len = 0;
  {
    MutexLock l(&mu_);
    auto it = registered_.find(ptr);
    if (it != registered_.end()) len = it->second;
  }
  if (len == 0) {
    CMA_CUDA_RETURN_IF_ERROR(cudaFreeHost(ptr));
    return absl::OkStatus();
  }
  // Unlike cudaFreeHost, unregistering does not wait for queued copies.
  // Forgotten only once unregistered: a failure here leaves the chunk
  // known, so the caller (which keeps it) can retry the same way rather
  // than hand a registered mmap to cudaFreeHost and leak it.
  CMA_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  CMA_CUDA_RETURN_IF_ERROR(cudaHostUnregister(ptr));
  {
    MutexLock l(&mu_);
    registered_.erase(ptr);
  }
  munmap(ptr, len);
  return absl::OkStatus();
}

}  // namespace cma
