// What does cudaMemDiscardBatchAsync do with a range that covers 2 MiB pages
// only partly? Fills 8 MiB of managed memory (4 pages) on the device with a
// pattern, discards ranges that start and end mid-page, and reports, per
// 64 KiB chunk, whether the pattern survived; also the discard's return code.
// A standalone experiment, built on the GPU machine:
//   nvcc -O2 -o pd partial_discard_experiment.cu && ./pd
// (result: bench/results/h200_core_fixes/partial_discard.txt).
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

__global__ void Fill(unsigned* p, size_t n, unsigned v) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = v;
  }
}

// Counts, per chunk, the words still holding `v` (read on the device, so
// the check itself migrates nothing to the host).
__global__ void Count(const unsigned* p, size_t words_per_chunk, unsigned v, unsigned* counts) {
  const size_t c = blockIdx.x;
  unsigned n = 0;
  for (size_t i = threadIdx.x; i < words_per_chunk; i += blockDim.x) {
    n += p[c * words_per_chunk + i] == v;
  }
  atomicAdd(&counts[c], n);
}

static void Try(const char* what, size_t lo, size_t hi) {
  const size_t kMiB = 1 << 20, kTotal = 8 * kMiB, kChunk = 64 * 1024;
  const size_t chunks = kTotal / kChunk, words = kChunk / 4;
  unsigned *p, *counts;
  cudaMallocManaged(&p, kTotal);
  cudaMalloc(&counts, chunks * sizeof(unsigned));
  cudaMemLocation dev{cudaMemLocationTypeDevice, 0};
  cudaMemPrefetchAsync(p, kTotal, dev, 0, 0);
  Fill<<<256, 256>>>(p, kTotal / 4, 0xC0FFEEu);
  cudaDeviceSynchronize();
  void* ptrs[1] = {reinterpret_cast<char*>(p) + lo};
  size_t sizes[1] = {hi - lo};
  cudaStream_t s;  // the legacy default stream is refused (invalid argument)
  cudaStreamCreate(&s);
  cudaError_t e = cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, s);
  cudaDeviceSynchronize();
  cudaStreamDestroy(s);
  cudaMemset(counts, 0, chunks * sizeof(unsigned));
  Count<<<chunks, 256>>>(p, words, 0xC0FFEEu, counts);
  std::vector<unsigned> h(chunks);
  cudaMemcpy(h.data(), counts, chunks * sizeof(unsigned), cudaMemcpyDeviceToHost);
  printf("%-44s discard [%4zu KiB, %4zu KiB): %s\n  kept per 64 KiB chunk (#=kept, .=lost, ~=partly): ",
         what, lo / 1024, hi / 1024, cudaGetErrorString(e));
  for (size_t c = 0; c < chunks; ++c) {
    if (c % 32 == 0) printf("|");
    printf("%c", h[c] == words ? '#' : h[c] == 0 ? '.' : '~');
  }
  printf("|\n");
  cudaGetLastError();
  cudaFree(p);
  cudaFree(counts);
}

int main() {
  const size_t kMiB = 1 << 20;
  Try("whole pages 1-2", 2 * kMiB, 6 * kMiB);
  Try("half of page 0 to half of page 3", kMiB, 7 * kMiB);
  Try("inside page 1 only", 2 * kMiB + 512 * 1024, 3 * kMiB + 512 * 1024);
  Try("4 KiB-aligned, page 1 and a half", 2 * kMiB, 5 * kMiB);
  Try("unaligned start (not 4 KiB)", 2 * kMiB + 100, 4 * kMiB);
  return 0;
}
