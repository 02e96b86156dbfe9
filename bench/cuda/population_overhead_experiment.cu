// What does populating managed pages cost the device beyond the pages
// themselves? cudaMemGetInfo's "used" after populating 4 GiB in 2 MiB pieces
// of a large managed range: pieces aligned to 2 MiB, pieces straddling two
// 2 MiB blocks, one prefetch of the whole, and cudaMalloc of the same size
// for reference. Also prints the alignment cudaMallocManaged gives.
// A standalone experiment, built on the GPU machine:
//   nvcc -O2 -o po population_overhead_experiment.cu && ./po
// (result: bench/results/h200_footprint/population_overhead.txt).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

static const size_t kMiB = size_t{1} << 20, kPage = 2 * kMiB, kBytes = 4096 * kMiB;

static size_t Used() {
  size_t f, t;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&f, &t);
  return t - f;
}

static long DeltaMiB(size_t before) { return (long)((Used() - before) / kMiB); }

// Populates kBytes at `start` in kPage pieces, one prefetch each.
static void PopulatePieces(char* start) {
  const cudaMemLocation dev{cudaMemLocationTypeDevice, 0};
  for (size_t off = 0; off < kBytes; off += kPage) cudaMemPrefetchAsync(start + off, kPage, dev, 0, 0);
}

static void Managed(const char* what, size_t offset, bool pieces) {
  const size_t range = 64 * 1024 * kMiB;  // address space only
  char* p = nullptr;
  const size_t before = Used();
  if (cudaMallocManaged(&p, range) != cudaSuccess) {
    printf("%s: cudaMallocManaged failed\n", what);
    return;
  }
  const cudaMemLocation dev{cudaMemLocationTypeDevice, 0};
  cudaMemAdvise(p, range, cudaMemAdviseSetPreferredLocation, dev);
  const uintptr_t base = reinterpret_cast<uintptr_t>(p);
  char* start = reinterpret_cast<char*>((base + kPage - 1) / kPage * kPage + offset);
  if (pieces) {
    PopulatePieces(start);
  } else {
    cudaMemPrefetchAsync(start, kBytes, dev, 0, 0);
  }
  printf("%-44s base %% 2 MiB = %7zu KiB: used +%ld MiB for %zu MiB\n", what,
         (size_t)(base % kPage) / 1024, DeltaMiB(before), kBytes / kMiB);
  cudaFree(p);
}

int main() {
  cudaFree(nullptr);  // the context, before any measurement
  {
    const size_t before = Used();
    void* p = nullptr;
    cudaMalloc(&p, kBytes);
    printf("%-44s used +%ld MiB for %zu MiB\n", "cudaMalloc", DeltaMiB(before), kBytes / kMiB);
    cudaFree(p);
  }
  Managed("managed, 2 MiB pieces aligned to 2 MiB", 0, true);
  Managed("managed, 2 MiB pieces offset by 1 MiB", kMiB, true);
  Managed("managed, one prefetch of the whole", 0, false);
  for (size_t n : {size_t{1} << 20, size_t{3} << 20, size_t{64} << 20, size_t{1} << 34}) {
    char* p = nullptr;
    cudaMallocManaged(&p, n);
    printf("cudaMallocManaged(%zu MiB) base %% 2 MiB = %zu KiB\n", n / kMiB,
           (size_t)(reinterpret_cast<uintptr_t>(p) % kPage) / 1024);
    cudaFree(p);
  }
  return 0;
}
