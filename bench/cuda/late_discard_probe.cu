// Does the driver's work behind a discard reach pages written again right
// after it, so that a later migration loses what was written? GPU-only;
// prints one JSON object.
//
// Why (issue 48): on the H200, a training with learn_step:1 at 2x changed
// its losses with discards on and kept them with discards off (session 5,
// calls 2-5); replayed on the host backend nothing live is ever discarded in
// issue order. allocator/discard_fence.h records that the driver keeps
// working behind a discard for about 30 ms after the discard completed on
// its stream. The guess this probes: pages reused in that time (populated,
// written by a kernel) keep the discard's mark, and a prefetch to the host
// then skips them as dead, so the data is gone when it comes back.
//
// Each cycle, for every variant: --pages 2 MiB pages of managed memory,
// resident on the device and written with one pattern; discarded on stream
// `s`; then, on `s`, populated again (prefetch to the device, as the
// allocator's hand-out does), at once or after a fence (a host function on
// a side stream behind the discard, which `s` waits for: DiscardFence), and
// written by a kernel with the cycle's pattern; then either nothing more
// ("stay") or, on a second stream that waits for `s` (the learned step's
// away and back streams), a prefetch to the host and one back ("migrate");
// then a kernel counts the pages whose contents differ from the pattern.
//
//   late_discard_probe [--pages=256] [--cycles=20]
//
// Reported per variant: cycles, pages lost in all, cycles with a loss.
// Memory: --pages x 2 MiB of managed memory on the device, nothing else.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                               \
  do {                                                                            \
    cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "late_discard_probe: %s: %s (line %d)\n", #call,       \
                   cudaGetErrorString(e_), __LINE__);                             \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

constexpr size_t kPage = size_t{2} << 20;
constexpr size_t kIntsPerPage = kPage / sizeof(int);

__global__ void Write(int* p, size_t n, int pattern) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = pattern ^ static_cast<int>(i);
  }
}

// lost[page] = 1 where any int of the page differs from the pattern.
__global__ void Check(const int* p, size_t n, int pattern, int* lost) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    if (p[i] != (pattern ^ static_cast<int>(i))) lost[i / kIntsPerPage] = 1;
  }
}

void CUDART_CB Nothing(void*) {}

struct Variant {
  const char* name;
  bool fenced;
  bool migrate;
  bool synced;  // the host waited for the old contents before the discard
  long long pages_lost = 0;
  int cycles_with_loss = 0;
};

}  // namespace

int main(int argc, char** argv) {
  size_t pages = 256;
  int cycles = 20;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--pages=", 8) == 0) {
      pages = std::strtoull(argv[i] + 8, nullptr, 10);
    } else if (std::strncmp(argv[i], "--cycles=", 9) == 0) {
      cycles = std::atoi(argv[i] + 9);
    } else {
      std::fprintf(stderr, "usage: late_discard_probe [--pages=256] [--cycles=20]\n");
      return 2;
    }
  }
  if (pages == 0 || cycles <= 0) {
    std::fprintf(stderr, "late_discard_probe: --pages and --cycles must be positive\n");
    return 2;
  }
  int device = 0;
  CHECK(cudaSetDevice(device));
  const size_t bytes = pages * kPage;
  const size_t n = bytes / sizeof(int);
  int* p = nullptr;
  int* lost = nullptr;
  CHECK(cudaMallocManaged(&p, bytes));
  CHECK(cudaMallocManaged(&lost, pages * sizeof(int)));
  cudaStream_t s, other, side;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t discarded, behind, written, moved;
  for (cudaEvent_t* e : {&discarded, &behind, &written, &moved}) {
    CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  cudaMemLocation dev{cudaMemLocationTypeDevice, device};
  cudaMemLocation host{cudaMemLocationTypeHost, 0};
  const int blocks = 1024, threads = 256;
  // "_queued": nothing waits on the host between the old write, the discard
  // and the reuse, as in a training step where a free and the next
  // allocation follow each other in one stream's queue.
  std::vector<Variant> variants = {{"stay_at_once", false, false, true},
                                   {"stay_fenced", true, false, true},
                                   {"migrate_at_once", false, true, true},
                                   {"migrate_fenced", true, true, true},
                                   {"migrate_at_once_queued", false, true, false},
                                   {"migrate_fenced_queued", true, true, false}};
  std::vector<int> seen(pages);
  for (int c = 0; c < cycles; ++c) {
    for (Variant& v : variants) {
      const int old_pattern = 0x11110000 + c, pattern = 0x5a5a0000 + c;
      // Resident on the device, written: the device holds the only copy.
      CHECK(cudaMemPrefetchAsync(p, bytes, dev, 0, s));
      Write<<<blocks, threads, 0, s>>>(p, n, old_pattern);
      CHECK(cudaGetLastError());
      if (v.synced) CHECK(cudaStreamSynchronize(s));
      // The discard, then the pages in use again.
      void* ptrs[1] = {p};
      size_t sizes[1] = {bytes};
      CHECK(cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, s));
      if (v.fenced) {
        CHECK(cudaEventRecord(discarded, s));
        CHECK(cudaStreamWaitEvent(side, discarded, 0));
        CHECK(cudaLaunchHostFunc(side, Nothing, nullptr));
        CHECK(cudaEventRecord(behind, side));
        CHECK(cudaStreamWaitEvent(s, behind, 0));
      }
      CHECK(cudaMemPrefetchAsync(p, bytes, dev, 0, s));
      Write<<<blocks, threads, 0, s>>>(p, n, pattern);
      CHECK(cudaGetLastError());
      if (v.migrate) {
        CHECK(cudaEventRecord(written, s));
        CHECK(cudaStreamWaitEvent(other, written, 0));
        CHECK(cudaMemPrefetchAsync(p, bytes, host, 0, other));
        CHECK(cudaMemPrefetchAsync(p, bytes, dev, 0, other));
        CHECK(cudaEventRecord(moved, other));
        CHECK(cudaStreamWaitEvent(s, moved, 0));
      }
      CHECK(cudaMemsetAsync(lost, 0, pages * sizeof(int), s));
      Check<<<blocks, threads, 0, s>>>(p, n, pattern, lost);
      CHECK(cudaGetLastError());
      CHECK(cudaStreamSynchronize(s));
      CHECK(cudaStreamSynchronize(other));
      CHECK(cudaMemcpy(seen.data(), lost, pages * sizeof(int), cudaMemcpyDefault));
      long long bad = 0;
      for (int x : seen) bad += x != 0;
      v.pages_lost += bad;
      v.cycles_with_loss += bad != 0;
    }
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, device));
  int driver = 0;
  CHECK(cudaDriverGetVersion(&driver));
  std::printf("{\"gpu\": \"%s\", \"driver_api\": %d, \"pages\": %zu, \"cycles\": %d, \"variants\": {",
              prop.name, driver, pages, cycles);
  for (size_t i = 0; i < variants.size(); ++i) {
    const Variant& v = variants[i];
    std::printf("%s\"%s\": {\"pages_lost\": %lld, \"cycles_with_loss\": %d}", i ? ", " : "",
                v.name, v.pages_lost, v.cycles_with_loss);
  }
  std::printf("}}\n");
  CHECK(cudaFree(p));
  CHECK(cudaFree(lost));
  return 0;
}
