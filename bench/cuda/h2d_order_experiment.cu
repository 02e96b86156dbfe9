// Is a copy from host memory into managed memory ordered after the work
// already queued on its stream? A kernel that first spins (~20 ms) and then
// reads buffer A into B is queued; right behind it, on the same stream, a
// cudaMemcpyAsync overwrites A from host memory. In stream order B gets A's
// old values; if B holds any of the new ones, the copy ran early. Cases: A
// from cudaMalloc (the control), from cudaMallocManaged (untouched, or
// prefetched to the device, or with the device as preferred location);
// the host side pageable (malloc) or pinned. This is what PyTorch does for
// tensor.to('cuda', dtype) of a CPU tensor: a copy into a temporary, a
// conversion kernel reading it, the temporary freed, and the next copy into
// the same block (a caching allocator reuses it at once on the stream).
// A standalone experiment, built on the GPU machine:
//   nvcc -O2 -arch=sm_90 -o h2d h2d_order_experiment.cu && ./h2d
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void SpinThenCopy(const int* a, int* b, size_t n, long long spin) {
  const long long start = clock64();
  while (clock64() - start < spin) {
  }
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    b[i] = a[i];
  }
}

__global__ void Fill(int* a, size_t n, int v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    a[i] = v;
  }
}

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e = (x);                                                       \
    if (e != cudaSuccess) {                                                    \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                           \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

enum Kind { kDevice, kManaged, kManagedPrefetched, kManagedPreferred };
static const char* kKindName[] = {"cudaMalloc", "managed", "managed+prefetch",
                                  "managed+preferred_device"};

int main() {
  int dev = 0;
  CHECK(cudaSetDevice(dev));
  int clock_khz = 0;
  CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev));
  const long long spin = (long long)clock_khz * 20;  // ~20 ms
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t sizes[] = {4 << 10, 1 << 20, 64 << 20};
  const int reps = 10;
  printf("kind host bytes reps early_copies(any B element new) new_elements_total\n");
  for (int kind = kDevice; kind <= kManagedPreferred; ++kind) {
    for (int pinned = 0; pinned <= 1; ++pinned) {
      for (size_t bytes : sizes) {
        const size_t n = bytes / sizeof(int);
        int *a, *b, *host, *check;
        if (kind == kDevice) {
          CHECK(cudaMalloc(&a, bytes));
        } else {
          CHECK(cudaMallocManaged(&a, bytes));
        }
        CHECK(cudaMalloc(&b, bytes));
        cudaMemLocation loc{cudaMemLocationTypeDevice, dev};
        if (kind == kManagedPreferred) {
          CHECK(cudaMemAdvise(a, bytes, cudaMemAdviseSetPreferredLocation, loc));
        }
        if (pinned) {
          CHECK(cudaMallocHost(&host, bytes));
        } else {
          host = (int*)malloc(bytes);
        }
        check = (int*)malloc(bytes);
        int early = 0;
        size_t new_total = 0;
        for (int r = 0; r < reps; ++r) {
          for (size_t i = 0; i < n; ++i) host[i] = 2 + r;
          if (kind == kManagedPrefetched) CHECK(cudaMemPrefetchAsync(a, bytes, loc, 0, s));
          Fill<<<256, 256, 0, s>>>(a, n, 1);
          CHECK(cudaStreamSynchronize(s));
          SpinThenCopy<<<256, 256, 0, s>>>(a, b, n, spin);
          CHECK(cudaMemcpyAsync(a, host, bytes, cudaMemcpyHostToDevice, s));
          CHECK(cudaStreamSynchronize(s));
          CHECK(cudaMemcpy(check, b, bytes, cudaMemcpyDeviceToHost));
          size_t fresh = 0;
          for (size_t i = 0; i < n; ++i) fresh += check[i] != 1;
          early += fresh != 0;
          new_total += fresh;
        }
        printf("%s %s %zu %d %d %zu\n", kKindName[kind], pinned ? "pinned" : "pageable", bytes,
               reps, early, new_total);
        fflush(stdout);
        CHECK(cudaFree(a));
        CHECK(cudaFree(b));
        if (pinned) {
          CHECK(cudaFreeHost(host));
        } else {
          free(host);
        }
        free(check);
      }
    }
  }
  return 0;
}
