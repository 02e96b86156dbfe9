#include <cuda_runtime.h>

#include "bench/cuda/kernels.h"

namespace cma {
namespace {

__global__ void FillKernel(uint4* p, std::size_t n4, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t w = seed + static_cast<std::uint32_t>(4 * i);
    p[i] = make_uint4(w, w + 1, w + 2, w + 3);
  }
}

__global__ void CheckKernel(const uint4* p, std::size_t n4, std::uint32_t seed,
                            unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t w = seed + static_cast<std::uint32_t>(4 * i);
    const uint4 v = p[i];
    bad += (v.x != w) + (v.y != w + 1) + (v.z != w + 2) + (v.w != w + 3);
  }
  if (bad) atomicAdd(mismatches, bad);
}

__global__ void ReadKernel(const uint4* p, std::size_t n4, unsigned long long* sink) {
  unsigned int acc = 0;
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1ull);  // keeps the loads alive
}

__global__ void SpinKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

absl::Status LaunchStatus(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + " launch failed: " + cudaGetErrorString(err));
}

unsigned int Blocks(std::size_t n4) {
  const std::size_t b = (n4 + 255) / 256;
  return static_cast<unsigned int>(b < 132 * 16 ? (b ? b : 1) : 132 * 16);
}

}  // namespace

absl::Status LaunchFill(void* p, std::size_t bytes, std::uint32_t seed, Stream stream) {
  const std::size_t n4 = bytes / 16;
  FillKernel<<<Blocks(n4), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<uint4*>(p), n4, seed);
  return LaunchStatus("FillKernel");
}

absl::Status LaunchCheck(const void* p, std::size_t bytes, std::uint32_t seed,
                         unsigned long long* mismatches, Stream stream) {
  const std::size_t n4 = bytes / 16;
  CheckKernel<<<Blocks(n4), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(p), n4, seed, mismatches);
  return LaunchStatus("CheckKernel");
}

absl::Status LaunchRead(const void* p, std::size_t bytes, unsigned long long* sink,
                        Stream stream) {
  const std::size_t n4 = bytes / 16;
  ReadKernel<<<Blocks(n4), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(p), n4, sink);
  return LaunchStatus("ReadKernel");
}

absl::Status LaunchSpin(long long cycles, Stream stream) {
  SpinKernel<<<1, 1, 0, reinterpret_cast<cudaStream_t>(stream)>>>(cycles);
  return LaunchStatus("SpinKernel");
}

}  // namespace cma
