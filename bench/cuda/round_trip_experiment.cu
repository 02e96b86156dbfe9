// Issue 31's round trip (CPU and GPU take turns on one 256 MiB buffer),
// in raw CUDA, to learn which placement a managed "move" should use:
//   pinned   : cudaMemcpyAsync H2D from pinned memory, kernel, D2H back
//   migrate  : managed, prefetch to the GPU, kernel, prefetch to the host
//   migrate8 : the same with both prefetches split over 8 streams
//   map      : managed, preferred location host + accessed by the GPU: the
//              kernel reads and writes host pages over the link, no migration
// Each round: a CPU pass over the buffer (16 threads add 1), then the GPU
// kernel (multiply by 2) and whatever brings the bytes back to the CPU.
// Reports ms per round (median of 10) and checks the values.
//   nvcc -O2 -o rt round_trip_experiment.cu && ./rt
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

__global__ void Scale(float* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] *= 2.0f;
  }
}

static void CpuPass(float* p, size_t n) {
  const int kThreads = 16;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([=] {
      const size_t lo = n * t / kThreads, hi = n * (t + 1) / kThreads;
      for (size_t i = lo; i < hi; ++i) p[i] += 1.0f;
    });
  }
  for (auto& t : ts) t.join();
}

static double Now() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
  const size_t kBytes = size_t{256} << 20, n = kBytes / 4;
  cudaStream_t s[8];
  for (auto& x : s) cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
  const cudaMemLocation dev{cudaMemLocationTypeDevice, 0}, host{cudaMemLocationTypeHost, 0};
  for (const char* mode : {"pinned", "migrate", "migrate8", "map", "cpu_only"}) {
    float *h = nullptr, *d = nullptr;
    const bool pinned = !strcmp(mode, "pinned");
    if (pinned) {
      cudaMallocHost(&h, kBytes);
      cudaMalloc(&d, kBytes);
    } else {
      cudaMallocManaged(&h, kBytes);
      if (!strcmp(mode, "map")) {
        cudaMemAdvise(h, kBytes, cudaMemAdviseSetPreferredLocation, host);
        cudaMemAdvise(h, kBytes, cudaMemAdviseSetAccessedBy, dev);
      }
    }
    std::memset(h, 0, kBytes);
    std::vector<double> ms;
    for (int round = 0; round < 13; ++round) {
      const double t0 = Now();
      CpuPass(h, n);
      if (!strcmp(mode, "cpu_only")) {
        // nothing else
      } else if (pinned) {
        cudaMemcpyAsync(d, h, kBytes, cudaMemcpyHostToDevice, s[0]);
        Scale<<<1024, 256, 0, s[0]>>>(d, n);
        cudaMemcpyAsync(h, d, kBytes, cudaMemcpyDeviceToHost, s[0]);
        cudaStreamSynchronize(s[0]);
      } else if (!strcmp(mode, "map")) {
        Scale<<<1024, 256, 0, s[0]>>>(h, n);
        cudaStreamSynchronize(s[0]);
      } else {
        const int k = !strcmp(mode, "migrate8") ? 8 : 1;
        for (int i = 0; i < k; ++i) cudaMemPrefetchAsync(h + n / k * i, kBytes / k, dev, 0, s[i]);
        for (int i = 0; i < k; ++i) cudaStreamSynchronize(s[i]);
        Scale<<<1024, 256, 0, s[0]>>>(h, n);
        cudaStreamSynchronize(s[0]);
        for (int i = 0; i < k; ++i) cudaMemPrefetchAsync(h + n / k * i, kBytes / k, host, 0, s[i]);
        for (int i = 0; i < k; ++i) cudaStreamSynchronize(s[i]);
      }
      if (round >= 3) ms.push_back(Now() - t0);
    }
    // After 13 rounds of x = (x + 1) * 2 from 0 (cpu_only: x + 1).
    double want = 0;
    for (int r = 0; r < 13; ++r) want = !strcmp(mode, "cpu_only") ? want + 1 : (want + 1) * 2;
    const bool ok = h[0] == static_cast<float>(want) && h[n - 1] == static_cast<float>(want);
    std::sort(ms.begin(), ms.end());
    printf("%-9s %7.2f ms/round (min %.2f)  values %s  %s\n", mode, ms[ms.size() / 2], ms[0],
           ok ? "ok" : "WRONG", cudaGetErrorString(cudaGetLastError()));
    if (pinned) {
      cudaFreeHost(h);
      cudaFree(d);
    } else {
      cudaFree(h);
    }
  }
  return 0;
}
