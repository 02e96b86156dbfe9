// In what steps does cudaMemGetInfo's "used" grow as managed pages are
// populated one 2 MiB page at a time? Prints each change over 200 pages, and
// whether a second range reuses what the first one left after cudaFree.
// A standalone experiment, built on the GPU machine:
//   nvcc -O2 -o ug uvm_granule_experiment.cu && ./ug
// (result: bench/results/h200_footprint/uvm_granule.txt).
#include <cuda_runtime.h>

#include <cstdio>

static const size_t kMiB = size_t{1} << 20, kPage = 2 * kMiB;

static size_t Used() {
  size_t f, t;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&f, &t);
  return t - f;
}

static void Populate(const char* what, int pages) {
  char* p = nullptr;
  cudaMallocManaged(&p, 1024 * kMiB);
  const cudaMemLocation dev{cudaMemLocationTypeDevice, 0};
  const size_t start = Used();
  size_t last = start;
  for (int i = 0; i < pages; ++i) {
    cudaMemPrefetchAsync(p + i * kPage, kPage, dev, 0, 0);
    const size_t now = Used();
    if (now != last) {
      printf("%s: after %3d pages (%4d MiB) used %+5ld MiB\n", what, i + 1, (i + 1) * 2,
             ((long)now - (long)start) / (long)kMiB);
      last = now;
    }
  }
  cudaFree(p);
  printf("%s: after cudaFree used %+ld MiB\n", what, ((long)Used() - (long)start) / (long)kMiB);
}

int main() {
  cudaFree(nullptr);
  Populate("first range", 200);
  Populate("second range", 200);
  return 0;
}
