// Does populating managed pages reuse memory freed by a discard, within the
// same cudaMallocManaged range and across ranges? Prints the device memory in
// use (cudaMemGetInfo) after each step. A standalone experiment, built on the
// GPU machine: nvcc -O2 -o dr discard_reuse_experiment.cu && ./dr
// (result: bench/results/h200_arena/discard_reuse.txt).
#include <cuda_runtime.h>

#include <cstdio>

static size_t Free() {
  size_t f, t;
  cudaDeviceSynchronize();
  cudaMemGetInfo(&f, &t);
  return f;
}
static void Prefetch(char* p, size_t n, cudaStream_t s) {
  cudaMemLocation loc{cudaMemLocationTypeDevice, 0};
  cudaMemPrefetchAsync(p, n, loc, 0, s);
}
static void Discard(char* p, size_t n, cudaStream_t s) {
  void* ptrs[1] = {p};
  size_t sizes[1] = {n};
  cudaError_t e = cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, s);
  if (e != cudaSuccess) printf("discard: %s\n", cudaGetErrorString(e));
}
static long MiB(size_t start, size_t now) { return (long)(start - now) / (1L << 20); }

int main() {
  const size_t M = 1 << 20, N = 256 * M;
  cudaStream_t s;
  cudaStreamCreate(&s);
  char *a, *b;
  cudaMallocManaged(&a, 4096 * M);
  cudaMallocManaged(&b, 4096 * M);
  const size_t f0 = Free();
  Prefetch(a, N, s);
  printf("populate A[0,256M): used %+ld MiB\n", MiB(f0, Free()));
  Discard(a, N, s);
  printf("discard A[0,256M): used now %+ld MiB\n", MiB(f0, Free()));
  Prefetch(a + 1024 * M, N, s);
  printf("populate A[1G,1G+256M) same range: used now %+ld MiB\n", MiB(f0, Free()));
  Discard(a + 1024 * M, N, s);
  const size_t f4 = Free();
  Prefetch(b, N, s);
  printf("discard it, populate B[0,256M) other range: used now %+ld MiB (before %+ld)\n",
         MiB(f0, Free()), MiB(f0, f4));
  Prefetch(a, 2 * N, s);
  printf("populate A[0,512M) again: used now %+ld MiB\n", MiB(f0, Free()));
  // Discard on stream s, populate on another stream t ordered after it.
  cudaStream_t t;
  cudaStreamCreate(&t);
  Discard(a, 2 * N, s);
  cudaEvent_t ev;
  cudaEventCreate(&ev);
  cudaEventRecord(ev, s);
  cudaStreamWaitEvent(t, ev, 0);
  Prefetch(a + 2048 * M, 2 * N, t);
  printf("discard A[0,512M) on s, populate A[2G,2G+512M) on t after it: used now %+ld MiB\n",
         MiB(f0, Free()));
  cudaFree(a);
  cudaFree(b);
  printf("after cudaFree: used %+ld MiB\n", MiB(f0, Free()));
  return 0;
}
