// How fast can a live allocation's device pages leave for the host and come
// back (issue 48: the away state's transport)? GPU-only; prints one JSON
// object. Each variant moves a range of managed memory that a kernel has
// just written on the device (so the device holds the only copy), timed by
// events on the stream that moves it; the median of --reps runs.
//
//   prefetch          cudaMemPrefetchAsync to the host in 64 MiB calls (what
//                     the allocator's SendAway does today, batched)
//   prefetch_2m       the same in 2 MiB calls
//   prefetch_batch    one cudaMemPrefetchBatchAsync of 64 MiB ranges
//   prefetch_pref_host  after cudaMemAdviseSetPreferredLocation(host)
//   prefetch_duplex   the D2H prefetch while another range is prefetched H2D
//                     on a second stream (the rate reported is D2H's)
//   copy_discard      cudaMemcpyAsync into pinned memory, then
//                     cudaMemDiscardBatchAsync of the range: what a staged
//                     transport would cost (the contents then live only in
//                     the pinned copy)
//   back_prefetch     the way back: H2D prefetch of the range sent by
//                     `prefetch` (for comparison)
//   back_copy         the way back of copy_discard: discard-and-prefetch to
//                     the device (populating, no transfer), then
//                     cudaMemcpyAsync from pinned
//
// Then "overlap": does issuing a transfer hold up the thread that launches
// the compute? A run of memory-bound kernels on a third stream (alone: its
// wall time), then the same run while --mib goes to the host (D2H prefetch)
// or comes back (H2D prefetch), its 64 MiB calls issued either from the
// launching thread between kernels ("same") or from a second thread
// ("thread"); "issue_ms" is the time the launching thread spent inside the
// transfer calls (for "thread", the second thread's). Ideal: max(compute,
// transfer).
//
// Then "dep": the same kernels, and at a quarter of them the whole range
// moves in one go on its stream, which first waits for an event recorded
// on the kernels' stream (still busy: a transfer that must follow the
// step's work so far, as a bring back does) or for nothing ("nodep");
// issued from the launching thread ("same") or handed to a second thread
// ("thread").
//
//   away_transport_bench [--mib=1024] [--reps=3]
//
// Memory: 2x --mib of managed memory on the device, --mib of pinned host,
// 512 MiB of device memory for the kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CHECK(call)                                                                   \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "away_transport_bench: %s: %s (line %d)\n", #call,         \
                   cudaGetErrorString(e_), __LINE__);                                 \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr size_t kMiB = size_t{1} << 20;

__global__ void Fill(int* p, size_t n, int v) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{gridDim.x} * blockDim.x) {
    p[i] = v + static_cast<int>(i);
  }
}

struct Run {
  cudaStream_t s, other;
  cudaEvent_t t0, t1;
  int device;
  size_t bytes;
  char *range, *second;
  void* pinned;
  cudaMemLocation host{cudaMemLocationTypeHost, 0};
  cudaMemLocation dev{};

  // The range on the device, written there by a kernel.
  void WriteOnDevice(char* p, int v) {
    CHECK(cudaMemPrefetchAsync(p, bytes, dev, 0, s));
    Fill<<<1024, 256, 0, s>>>(reinterpret_cast<int*>(p), bytes / sizeof(int), v);
    CHECK(cudaStreamSynchronize(s));
  }
  template <typename F>
  double Time(F issue) {
    CHECK(cudaEventRecord(t0, s));
    issue();
    CHECK(cudaEventRecord(t1, s));
    CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    return static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
  }
  // The range as 64 MiB pieces, for the batch calls.
  struct Pieces {
    std::vector<void*> ptrs;
    std::vector<size_t> sizes;
  };
  Pieces Split(char* p) const {
    Pieces out;
    for (size_t off = 0; off < bytes; off += 64 * kMiB) {
      out.ptrs.push_back(p + off);
      out.sizes.push_back(std::min(64 * kMiB, bytes - off));
    }
    return out;
  }
  void PrefetchChunks(char* p, size_t chunk, const cudaMemLocation& to, cudaStream_t st) {
    for (size_t off = 0; off < bytes; off += chunk) {
      CHECK(cudaMemPrefetchAsync(p + off, std::min(chunk, bytes - off), to, 0, st));
    }
  }
  double Variant(const std::string& name) {
    const cudaMemLocation to_host = host;
    if (name == "back_prefetch") {
      WriteOnDevice(range, 1);
      CHECK(cudaMemPrefetchAsync(range, bytes, host, 0, s));
      CHECK(cudaStreamSynchronize(s));
      return Time([&] { PrefetchChunks(range, 64 * kMiB, dev, s); });
    }
    if (name == "back_copy") {
      WriteOnDevice(range, 2);
      CHECK(cudaMemcpyAsync(pinned, range, bytes, cudaMemcpyDeviceToHost, s));
      void* ptrs[] = {range};
      size_t sizes[] = {bytes};
      CHECK(cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, s));
      CHECK(cudaStreamSynchronize(s));
      return Time([&] {
        Pieces ps = Split(range);
        size_t idx = 0;
        CHECK(cudaMemDiscardAndPrefetchBatchAsync(ps.ptrs.data(), ps.sizes.data(), ps.ptrs.size(),
                                                  &dev, &idx, 1, 0, s));
        CHECK(cudaMemcpyAsync(range, pinned, bytes, cudaMemcpyHostToDevice, s));
      });
    }
    WriteOnDevice(range, 3);
    if (name == "prefetch") return Time([&] { PrefetchChunks(range, 64 * kMiB, to_host, s); });
    if (name == "prefetch_2m") return Time([&] { PrefetchChunks(range, 2 * kMiB, to_host, s); });
    if (name == "prefetch_batch") {
      return Time([&] {
        Pieces ps = Split(range);
        size_t idx = 0;
        CHECK(cudaMemPrefetchBatchAsync(ps.ptrs.data(), ps.sizes.data(), ps.ptrs.size(), &host,
                                        &idx, 1, 0, s));
      });
    }
    if (name == "prefetch_pref_host") {
      CHECK(cudaMemAdvise(range, bytes, cudaMemAdviseSetPreferredLocation, host));
      const double r = Time([&] { PrefetchChunks(range, 64 * kMiB, to_host, s); });
      CHECK(cudaMemAdvise(range, bytes, cudaMemAdviseUnsetPreferredLocation, host));
      return r;
    }
    if (name == "prefetch_duplex") {
      // `second` starts on the host and goes to the device meanwhile.
      CHECK(cudaMemPrefetchAsync(second, bytes, host, 0, other));
      CHECK(cudaStreamSynchronize(other));
      CHECK(cudaEventRecord(t0, s));
      CHECK(cudaStreamWaitEvent(other, t0, 0));
      PrefetchChunks(second, 64 * kMiB, dev, other);
      PrefetchChunks(range, 64 * kMiB, to_host, s);
      CHECK(cudaEventRecord(t1, s));
      CHECK(cudaEventSynchronize(t1));
      CHECK(cudaStreamSynchronize(other));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, t0, t1));
      return static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
    }
    if (name == "copy_discard") {
      return Time([&] {
        CHECK(cudaMemcpyAsync(pinned, range, bytes, cudaMemcpyDeviceToHost, s));
        void* ptrs[] = {range};
        size_t sizes[] = {bytes};
        CHECK(cudaMemDiscardBatchAsync(ptrs, sizes, 1, 0, s));
      });
    }
    std::fprintf(stderr, "away_transport_bench: no variant %s\n", name.c_str());
    std::exit(2);
  }
};

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Memory-bound kernels on `c` interleaved with the 64 MiB calls that move
// `r.range` to `to` on `r.s`; returns {wall ms, ms the launching thread spent
// in transfer calls}. mode: 0 no transfer, 1 same thread, 2 second thread.
struct Overlap {
  double wall_ms, issue_ms;
};
Overlap RunOverlap(Run& r, cudaStream_t c, int* buf, size_t buf_ints, int kernels, int mode,
                   const cudaMemLocation& to) {
  const int chunks = static_cast<int>((r.bytes + 64 * kMiB - 1) / (64 * kMiB));
  const int every = std::max(1, kernels / (2 * chunks));  // transfers in the first half
  double issue = 0;
  CHECK(cudaDeviceSynchronize());
  const double t0 = NowMs();
  std::thread mover;
  if (mode == 2) {
    // issue_ms: the second thread's time inside the calls.
    mover = std::thread([&] {
      const double a = NowMs();
      r.PrefetchChunks(r.range, 64 * kMiB, to, r.s);
      issue = NowMs() - a;
    });
  }
  int issued = 0;
  for (int k = 0; k < kernels; ++k) {
    Fill<<<528, 512, 0, c>>>(buf, buf_ints, k);
    if (mode == 1 && k % every == 0 && issued < chunks) {
      const double a = NowMs();
      const size_t off = static_cast<size_t>(issued) * 64 * kMiB;
      CHECK(cudaMemPrefetchAsync(r.range + off, std::min(64 * kMiB, r.bytes - off), to, 0, r.s));
      issue += NowMs() - a;
      ++issued;
    }
  }
  if (mode == 1) {
    for (; issued < chunks; ++issued) {
      const size_t off = static_cast<size_t>(issued) * 64 * kMiB;
      CHECK(cudaMemPrefetchAsync(r.range + off, std::min(64 * kMiB, r.bytes - off), to, 0, r.s));
    }
  }
  if (mover.joinable()) mover.join();
  CHECK(cudaStreamSynchronize(c));
  CHECK(cudaStreamSynchronize(r.s));
  return {NowMs() - t0, issue};
}

// mode: 0 same thread, 1 second thread; dep: wait for the kernels so far.
Overlap RunDep(Run& r, cudaStream_t c, int* buf, size_t buf_ints, int kernels, bool thread,
               bool dep, const cudaMemLocation& to) {
  cudaEvent_t ev;
  CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  double issue = 0;
  CHECK(cudaDeviceSynchronize());
  const double t0 = NowMs();
  std::thread mover;
  auto move = [&] {
    const double a = NowMs();
    if (dep) CHECK(cudaStreamWaitEvent(r.s, ev, 0));
    r.PrefetchChunks(r.range, 64 * kMiB, to, r.s);
    issue = NowMs() - a;
  };
  for (int k = 0; k < kernels; ++k) {
    Fill<<<528, 512, 0, c>>>(buf, buf_ints, k);
    if (k == kernels / 4) {
      CHECK(cudaEventRecord(ev, c));
      if (thread) {
        mover = std::thread(move);
      } else {
        move();
      }
    }
  }
  if (mover.joinable()) mover.join();
  CHECK(cudaStreamSynchronize(c));
  CHECK(cudaStreamSynchronize(r.s));
  const double wall = NowMs() - t0;
  CHECK(cudaEventDestroy(ev));
  return {wall, issue};
}

void PrintDep(Run& r, int reps, cudaStream_t c, int* buf, size_t buf_ints, int kernels) {
  std::printf(", \"dep\": {");
  bool first = true;
  for (int dir = 0; dir < 2; ++dir) {
    for (int dep = 1; dep >= 0; --dep) {
      for (int thread = 0; thread < 2; ++thread) {
        std::vector<double> wall, issue;
        for (int k = 0; k <= reps; ++k) {
          if (dir == 0) {
            r.WriteOnDevice(r.range, 6);
          } else {
            CHECK(cudaMemPrefetchAsync(r.range, r.bytes, r.host, 0, r.s));
            CHECK(cudaStreamSynchronize(r.s));
          }
          Overlap o = RunDep(r, c, buf, buf_ints, kernels, thread == 1, dep == 1,
                             dir == 0 ? r.host : r.dev);
          if (k == 0) continue;
          wall.push_back(o.wall_ms);
          issue.push_back(o.issue_ms);
        }
        std::sort(wall.begin(), wall.end());
        std::sort(issue.begin(), issue.end());
        std::printf("%s\"%s_%s_%s\": {\"wall_ms\": %.1f, \"issue_ms\": %.1f}", first ? "" : ", ",
                    dir == 0 ? "d2h" : "h2d", dep ? "dep" : "nodep", thread ? "thread" : "same",
                    wall[wall.size() / 2], issue[issue.size() / 2]);
        std::fflush(stdout);
        first = false;
      }
    }
  }
  std::printf("}");
}

void PrintOverlap(Run& r, int reps) {
  cudaStream_t c;
  CHECK(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking));
  const size_t buf_bytes = 512 * kMiB;
  int* buf = nullptr;
  CHECK(cudaMalloc(reinterpret_cast<void**>(&buf), buf_bytes));
  const int kernels = 2000;
  std::printf(", \"overlap\": {\"kernels\": %d", kernels);
  for (int dir = 0; dir < 2; ++dir) {
    const cudaMemLocation to = dir == 0 ? r.host : r.dev;
    for (int mode = 0; mode < 3; ++mode) {
      if (dir == 1 && mode == 0) continue;
      std::vector<double> wall, issue;
      for (int k = 0; k <= reps; ++k) {
        // The range starts where the transfer moves it from.
        if (dir == 0) {
          r.WriteOnDevice(r.range, 5);
        } else {
          CHECK(cudaMemPrefetchAsync(r.range, r.bytes, r.host, 0, r.s));
          CHECK(cudaStreamSynchronize(r.s));
        }
        Overlap o = RunOverlap(r, c, buf, buf_bytes / sizeof(int), kernels, mode, to);
        if (k == 0) continue;  // warm
        wall.push_back(o.wall_ms);
        issue.push_back(o.issue_ms);
      }
      std::sort(wall.begin(), wall.end());
      std::sort(issue.begin(), issue.end());
      const char* names[] = {"compute_alone", "same", "thread"};
      std::printf(", \"%s%s\": {\"wall_ms\": %.1f, \"issue_ms\": %.1f}",
                  mode == 0 ? "" : (dir == 0 ? "d2h_" : "h2d_"), names[mode],
                  wall[wall.size() / 2], issue[issue.size() / 2]);
      std::fflush(stdout);
    }
  }
  std::printf("}");
  PrintDep(r, reps, c, buf, buf_bytes / sizeof(int), kernels);
  CHECK(cudaFree(buf));
  CHECK(cudaStreamDestroy(c));
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 1024;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--mib=", 6) == 0) {
      mib = std::strtoull(argv[i] + 6, nullptr, 10);
    } else if (std::strncmp(argv[i], "--reps=", 7) == 0) {
      reps = std::atoi(argv[i] + 7);
    } else {
      std::fprintf(stderr, "usage: away_transport_bench [--mib=1024] [--reps=3]\n");
      return 2;
    }
  }
  if (mib < 64 || reps < 1) {
    std::fprintf(stderr, "away_transport_bench: --mib must be >= 64 and --reps >= 1\n");
    return 2;
  }
  Run r;
  r.device = 0;
  CHECK(cudaSetDevice(r.device));
  r.dev = {cudaMemLocationTypeDevice, r.device};
  r.bytes = mib * kMiB;
  CHECK(cudaStreamCreateWithFlags(&r.s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&r.other, cudaStreamNonBlocking));
  CHECK(cudaEventCreate(&r.t0));
  CHECK(cudaEventCreate(&r.t1));
  CHECK(cudaMallocManaged(reinterpret_cast<void**>(&r.range), r.bytes));
  CHECK(cudaMallocManaged(reinterpret_cast<void**>(&r.second), r.bytes));
  CHECK(cudaHostAlloc(&r.pinned, r.bytes, cudaHostAllocPortable));
  std::memset(r.pinned, 0, r.bytes);
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, r.device));
  const char* variants[] = {"prefetch",        "prefetch_2m",  "prefetch_batch",
                            "prefetch_pref_host", "prefetch_duplex", "copy_discard",
                            "back_prefetch",   "back_copy"};
  std::printf("{\"gpu\": \"%s\", \"mib\": %zu, \"reps\": %d, \"gbps\": {", prop.name, mib, reps);
  bool first = true;
  for (const char* v : variants) {
    std::vector<double> rates;
    r.Variant(v);  // warm: the first cycle populates host pages for the first time
    for (int k = 0; k < reps; ++k) rates.push_back(r.Variant(v));
    std::sort(rates.begin(), rates.end());
    std::printf("%s\"%s\": %.2f", first ? "" : ", ", v, rates[rates.size() / 2]);
    std::fflush(stdout);
    first = false;
  }
  std::printf("}");
  PrintOverlap(r, reps);
  std::printf("}\n");
  CHECK(cudaFree(r.range));
  CHECK(cudaFree(r.second));
  CHECK(cudaFreeHost(r.pinned));
  return 0;
}
