// The host<->device link's bandwidth, each direction alone and both at once
// (issue 48: the link-bound time of bench/link_limit.cc uses the rates with
// both directions busy). For transfer sizes 64 MiB - 1 GiB, four ways:
//   copy_engine  cudaMemcpyAsync between pinned host and device memory;
//   sm_mapped    a kernel reading/writing mapped pinned host memory;
//   sm_managed   a kernel reading/writing managed memory preferred on the
//                host and accessed by the device (cma's host tier);
//   prefetch     cudaMemPrefetchAsync of managed memory to the device or
//                to the host (CUDA 13's cudaMemLocation form).
// "Both at once": the copy engines and prefetches run on two streams started
// together behind one gate; each direction's rate is what it moved until the
// first of the two finished, over that time (calls interpolated linearly).
// The SM copies run in one kernel, half its blocks each way, for a fixed
// time, so both directions are busy for the whole measurement.
//
// Prints a table and writes JSON (--json, default link_duplex.json): every
// measurement, and a summary per method (the best alone rates over the
// sizes, and the duplex pair of the size with the largest sum) that
// link_limit --link_json reads. GB/s = 1e9 bytes per second.
//
// Memory: at most 4 GiB device (2 GiB of it managed, prefetched), 2 GiB
// pinned host, 4 GiB managed. Runs ~15 s.
//   link_duplex_bench [--json=PATH] [--sizes_mib=64,256,1024] [--reps=3]
//                     [--sm_ms=100] [--device=0]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "link_duplex_bench: %s failed at line %d: %s (%s)\n", #call,  \
                   __LINE__, cudaGetErrorString(err_), cudaGetErrorName(err_));          \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

constexpr size_t kMiB = size_t{1} << 20;

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Holds its stream for `ns`: the gate behind which both directions start.
__global__ void Spin(unsigned long long ns) {
  const unsigned long long t0 = GlobalTimerNs();
  while (GlobalTimerNs() - t0 < ns) {
  }
}

// Blocks [0, h2d_blocks) copy h2d_src -> h2d_dst, the rest d2h_src ->
// d2h_dst, each sweeping its buffer (wrapping) until `ns` have passed;
// bytes[0] and bytes[1] get what each direction moved. Every block must be
// resident at once (the grid is sized from the occupancy), so all start
// together and stop together.
__global__ void TimedCopy(const int4* h2d_src, int4* h2d_dst, size_t h2d_n, const int4* d2h_src,
                          int4* d2h_dst, size_t d2h_n, unsigned h2d_blocks,
                          unsigned long long ns, unsigned long long* bytes) {
  const bool h2d = blockIdx.x < h2d_blocks;
  const unsigned role_block = h2d ? blockIdx.x : blockIdx.x - h2d_blocks;
  const unsigned role_blocks = h2d ? h2d_blocks : gridDim.x - h2d_blocks;
  const int4* src = h2d ? h2d_src : d2h_src;
  int4* dst = h2d ? h2d_dst : d2h_dst;
  const size_t n = h2d ? h2d_n : d2h_n;
  const size_t stride = static_cast<size_t>(role_blocks) * blockDim.x;  // < n (checked on the host)
  size_t i = static_cast<size_t>(role_block) * blockDim.x + threadIdx.x;
  constexpr int kUnroll = 4;  // loads in flight per thread: the link's latency is long
  unsigned long long moved = 0;
  const unsigned long long t0 = GlobalTimerNs();
  while (GlobalTimerNs() - t0 < ns) {
    size_t idx[kUnroll];
    int4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      idx[u] = i;
      i += stride;
      if (i >= n) i -= n;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[idx[u]];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[idx[u]] = v[u];
    moved += kUnroll * sizeof(int4);
  }
  atomicAdd(&bytes[h2d ? 0 : 1], moved);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Bytes a stream had finished by `t_ms`: whole calls, and the call in
// progress in proportion to its time.
double BytesBy(const std::vector<float>& ends_ms, double call_bytes, double t_ms) {
  double bytes = 0, prev = 0;
  for (float end : ends_ms) {
    if (end <= t_ms) {
      bytes += call_bytes;
      prev = end;
      continue;
    }
    bytes += call_bytes * (t_ms - prev) / std::max(1e-9, end - prev);
    break;
  }
  return bytes;
}

struct Rates {
  double h2d = 0, d2h = 0;  // GB/s; 0 where the direction did not run
};

struct Result {
  std::string method, mode;  // mode: h2d, d2h or duplex
  size_t bytes;
  Rates median;
  std::vector<Rates> reps;
};

class Bench {
 public:
  Bench(int device, size_t max_bytes, int reps, double sm_ms)
      : device_(device), max_(max_bytes), reps_(reps), sm_ns_(sm_ms * 1e6) {
    CHECK(cudaSetDevice(device_));
    CHECK(cudaGetDeviceProperties(&prop_, device_));
    int managed = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrConcurrentManagedAccess, device_));
    if (!managed) {
      std::fprintf(stderr, "link_duplex_bench: device %d lacks concurrent managed access\n",
                   device_);
      std::exit(1);
    }
    CHECK(cudaStreamCreateWithFlags(&gate_, cudaStreamNonBlocking));
    for (cudaStream_t* s : {&s_h2d_, &s_d2h_}) {
      CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    }
    CHECK(cudaEventCreate(&gate_done_));
    for (int i = 0; i < 2; ++i) CHECK(cudaEventCreate(&start_[i]));
    CHECK(cudaMalloc(&dev_a_, max_));
    CHECK(cudaMalloc(&dev_b_, max_));
    CHECK(cudaMemset(dev_a_, 1, max_));
    CHECK(cudaMemset(dev_b_, 2, max_));
    for (void** h : {&pinned_a_, &pinned_b_}) {
      CHECK(cudaHostAlloc(h, max_, cudaHostAllocMapped | cudaHostAllocPortable));
      std::memset(*h, 3, max_);
    }
    CHECK(cudaHostGetDevicePointer(&mapped_a_, pinned_a_, 0));
    CHECK(cudaHostGetDevicePointer(&mapped_b_, pinned_b_, 0));
    const cudaMemLocation host{cudaMemLocationTypeHost, 0};
    const cudaMemLocation dev{cudaMemLocationTypeDevice, device_};
    for (void** m : {&managed_a_, &managed_b_, &prefetch_a_, &prefetch_b_}) {
      CHECK(cudaMallocManaged(m, max_));
    }
    for (void* m : {managed_a_, managed_b_}) {
      CHECK(cudaMemAdvise(m, max_, cudaMemAdviseSetPreferredLocation, host));
      CHECK(cudaMemAdvise(m, max_, cudaMemAdviseSetAccessedBy, dev));
    }
    for (void* m : {managed_a_, managed_b_, prefetch_a_, prefetch_b_}) {
      std::memset(m, 4, max_);  // populated on the host
    }
    CHECK(cudaMalloc(&counters_, 2 * sizeof(unsigned long long)));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, TimedCopy, kThreads, 0));
    grid_ = std::max(2, per_sm * prop_.multiProcessorCount) & ~1;
    CHECK(cudaDeviceSynchronize());
  }

  ~Bench() {
    CHECK(cudaDeviceSynchronize());
    for (void* p : {dev_a_, dev_b_, static_cast<void*>(counters_)}) CHECK(cudaFree(p));
    for (void* p : {pinned_a_, pinned_b_}) CHECK(cudaFreeHost(p));
    for (void* p : {managed_a_, managed_b_, prefetch_a_, prefetch_b_}) CHECK(cudaFree(p));
  }

  const cudaDeviceProp& prop() const { return prop_; }
  int grid() const { return grid_; }

  // cudaMemcpyAsync, `calls` copies of `bytes` per running direction.
  Rates CopyEngine(size_t bytes, bool h2d, bool d2h) {
    const int calls = static_cast<int>(std::max<size_t>(3, (2048 * kMiB) / bytes));
    auto issue = [&](bool is_h2d, cudaStream_t s) {
      if (is_h2d) {
        CHECK(cudaMemcpyAsync(dev_a_, pinned_a_, bytes, cudaMemcpyHostToDevice, s));
      } else {
        CHECK(cudaMemcpyAsync(pinned_b_, dev_b_, bytes, cudaMemcpyDeviceToHost, s));
      }
    };
    return TwoStreams(bytes, h2d ? calls : 0, d2h ? calls : 0, issue);
  }

  // cudaMemPrefetchAsync of `bytes` in calls of at most 64 MiB: prefetch_a_
  // starts on the host and goes to the device, prefetch_b_ the other way;
  // each rep ends by putting them back, untimed.
  Rates Prefetch(size_t bytes, bool h2d, bool d2h) {
    const cudaMemLocation host{cudaMemLocationTypeHost, 0};
    const cudaMemLocation dev{cudaMemLocationTypeDevice, device_};
    // Start: a on the host, b on the device.
    CHECK(cudaMemPrefetchAsync(prefetch_a_, bytes, host, 0, s_h2d_));
    CHECK(cudaMemPrefetchAsync(prefetch_b_, bytes, dev, 0, s_d2h_));
    CHECK(cudaDeviceSynchronize());
    const size_t chunk = std::min(bytes, 64 * kMiB);
    const int calls = static_cast<int>(bytes / chunk);
    int next_h2d = 0, next_d2h = 0;
    auto issue = [&](bool is_h2d, cudaStream_t s) {
      int& k = is_h2d ? next_h2d : next_d2h;
      char* base = static_cast<char*>(is_h2d ? prefetch_a_ : prefetch_b_);
      CHECK(cudaMemPrefetchAsync(base + k * chunk, chunk, is_h2d ? dev : host, 0, s));
      ++k;
    };
    return TwoStreams(chunk, h2d ? calls : 0, d2h ? calls : 0, issue);
  }

  // One kernel, the SM copies: half the blocks each way when both run.
  Rates SmCopy(size_t bytes, bool managed, bool h2d, bool d2h) {
    const int4* h2d_src = static_cast<const int4*>(managed ? managed_a_ : mapped_a_);
    int4* d2h_dst = static_cast<int4*>(managed ? managed_b_ : mapped_b_);
    const size_t n = bytes / sizeof(int4);
    const unsigned h2d_blocks = h2d && d2h ? grid_ / 2 : (h2d ? grid_ : 0);
    if (static_cast<size_t>(grid_) * kThreads >= n) {
      std::fprintf(stderr, "link_duplex_bench: %zu bytes is too small for %d blocks\n", bytes,
                   grid_);
      std::exit(1);
    }
    CHECK(cudaMemsetAsync(counters_, 0, 2 * sizeof(unsigned long long), s_h2d_));
    CHECK(cudaEventRecord(start_[0], s_h2d_));
    TimedCopy<<<grid_, kThreads, 0, s_h2d_>>>(h2d_src, static_cast<int4*>(dev_a_), n,
                                              static_cast<const int4*>(dev_b_), d2h_dst, n,
                                              h2d_blocks, sm_ns_, counters_);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(start_[1], s_h2d_));
    unsigned long long moved[2];
    CHECK(cudaMemcpyAsync(moved, counters_, sizeof(moved), cudaMemcpyDeviceToHost, s_h2d_));
    CHECK(cudaStreamSynchronize(s_h2d_));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start_[0], start_[1]));
    return {h2d ? moved[0] / (ms * 1e6) : 0, d2h ? moved[1] / (ms * 1e6) : 0};
  }

  int reps() const { return reps_; }

 private:
  static constexpr int kThreads = 512;

  // `calls` calls of `call_bytes` per direction on two streams that start
  // together behind a gate; an event after each call dates it.
  template <typename Issue>
  Rates TwoStreams(size_t call_bytes, int h2d_calls, int d2h_calls, Issue issue) {
    // 10 ms: the host queues every call meanwhile (a prefetch call may take
    // a while to return), so both directions start together.
    Spin<<<1, 1, 0, gate_>>>(10'000'000);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(gate_done_, gate_));
    cudaStream_t streams[2] = {s_h2d_, s_d2h_};
    const int calls[2] = {h2d_calls, d2h_calls};
    std::vector<cudaEvent_t> ends[2];
    for (int d = 0; d < 2; ++d) {
      CHECK(cudaStreamWaitEvent(streams[d], gate_done_, 0));
      CHECK(cudaEventRecord(start_[d], streams[d]));
    }
    // Interleave the two directions' calls as they are queued.
    for (int k = 0; k < std::max(calls[0], calls[1]); ++k) {
      for (int d = 0; d < 2; ++d) {
        if (k >= calls[d]) continue;
        issue(d == 0, streams[d]);
        cudaEvent_t e;
        CHECK(cudaEventCreate(&e));
        CHECK(cudaEventRecord(e, streams[d]));
        ends[d].push_back(e);
      }
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<float> end_ms[2];
    for (int d = 0; d < 2; ++d) {
      for (cudaEvent_t e : ends[d]) {
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start_[0], e));  // one clock for both
        end_ms[d].push_back(ms);
        CHECK(cudaEventDestroy(e));
      }
    }
    // Until the first direction finishes (or the only one).
    double window = 1e300;
    for (int d = 0; d < 2; ++d) {
      if (!end_ms[d].empty()) window = std::min<double>(window, end_ms[d].back());
    }
    Rates r;
    if (calls[0] > 0) r.h2d = BytesBy(end_ms[0], call_bytes, window) / (window * 1e6);
    if (calls[1] > 0) r.d2h = BytesBy(end_ms[1], call_bytes, window) / (window * 1e6);
    return r;
  }

  int device_;
  size_t max_;
  int reps_;
  unsigned long long sm_ns_;
  cudaDeviceProp prop_{};
  int grid_ = 0;
  cudaStream_t gate_, s_h2d_, s_d2h_;
  cudaEvent_t gate_done_, start_[2];
  void *dev_a_, *dev_b_, *pinned_a_, *pinned_b_, *mapped_a_, *mapped_b_;
  void *managed_a_, *managed_b_, *prefetch_a_, *prefetch_b_;
  unsigned long long* counters_;
};

struct Options {
  std::string json = "link_duplex.json";
  std::vector<size_t> sizes = {64 * kMiB, 256 * kMiB, 1024 * kMiB};
  int reps = 3;
  double sm_ms = 100;
  int device = 0;
};

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const std::string k = std::string("--") + key + "=";
      return a.rfind(k, 0) == 0 ? argv[i] + k.size() : nullptr;
    };
    if (const char* v = value("json")) {
      o.json = v;
    } else if (const char* v = value("sizes_mib")) {
      o.sizes.clear();
      for (char* p = const_cast<char*>(v); *p;) {
        char* end;
        const long mib = std::strtol(p, &end, 10);
        if (end == p || mib < 64 || mib > 1024 || (*end && *end != ',')) {
          std::fprintf(stderr, "link_duplex_bench: --sizes_mib takes 64..1024, got '%s'\n", v);
          std::exit(2);
        }
        o.sizes.push_back(static_cast<size_t>(mib) * kMiB);
        p = *end ? end + 1 : end;
      }
    } else if (const char* v = value("reps")) {
      o.reps = std::max(1, std::atoi(v));
    } else if (const char* v = value("sm_ms")) {
      o.sm_ms = std::max(10.0, std::atof(v));
    } else if (const char* v = value("device")) {
      o.device = std::atoi(v);
    } else {
      std::fprintf(stderr,
                   "usage: link_duplex_bench [--json=PATH] [--sizes_mib=64,256,1024] [--reps=3] "
                   "[--sm_ms=100] [--device=0]\n");
      std::exit(2);
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = ParseArgs(argc, argv);
  const auto t0 = std::chrono::steady_clock::now();
  const size_t max_bytes = *std::max_element(opt.sizes.begin(), opt.sizes.end());
  std::vector<Result> results;
  int runtime = 0, driver = 0;
  CHECK(cudaRuntimeGetVersion(&runtime));
  CHECK(cudaDriverGetVersion(&driver));
  std::string gpu;
  int grid = 0;
  {
    Bench bench(opt.device, max_bytes, opt.reps, opt.sm_ms);
    gpu = bench.prop().name;
    grid = bench.grid();
    const char* methods[] = {"copy_engine", "sm_mapped", "sm_managed", "prefetch"};
    const char* modes[] = {"h2d", "d2h", "duplex"};
    for (size_t bytes : opt.sizes) {
      for (const char* method : methods) {
        for (const char* mode : modes) {
          const bool h2d = std::strcmp(mode, "d2h") != 0, d2h = std::strcmp(mode, "h2d") != 0;
          Result r{method, mode, bytes, {}, {}};
          // One untimed round first: first-touch mappings, clocks.
          for (int rep = -1; rep < bench.reps(); ++rep) {
            Rates x;
            if (r.method == "copy_engine") x = bench.CopyEngine(bytes, h2d, d2h);
            if (r.method == "sm_mapped") x = bench.SmCopy(bytes, false, h2d, d2h);
            if (r.method == "sm_managed") x = bench.SmCopy(bytes, true, h2d, d2h);
            if (r.method == "prefetch") x = bench.Prefetch(bytes, h2d, d2h);
            if (rep >= 0) r.reps.push_back(x);
          }
          std::vector<double> h, d;
          for (const Rates& x : r.reps) {
            h.push_back(x.h2d);
            d.push_back(x.d2h);
          }
          r.median = {Median(h), Median(d)};
          std::printf("%-12s %5zu MiB %-7s H2D %7.2f GB/s  D2H %7.2f GB/s  sum %7.2f\n", method,
                      bytes / kMiB, mode, r.median.h2d, r.median.d2h,
                      r.median.h2d + r.median.d2h);
          std::fflush(stdout);
          results.push_back(r);
        }
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FILE* f = std::fopen(opt.json.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "link_duplex_bench: cannot write %s\n", opt.json.c_str());
    return 1;
  }
  std::fprintf(f, "{\n \"bench\": \"link_duplex_bench\",\n \"gpu\": \"%s\",\n", gpu.c_str());
  std::fprintf(f, " \"cuda_runtime\": %d,\n \"cuda_driver\": %d,\n \"seconds\": %.2f,\n", runtime,
               driver, seconds);
  std::fprintf(f, " \"sm_blocks\": %d,\n \"sm_threads_per_block\": 512,\n \"sm_ms\": %.1f,\n",
               grid, opt.sm_ms);
  std::fprintf(f, " \"units\": \"GB/s = 1e9 bytes/s; medians of reps\",\n \"results\": [\n");
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::fprintf(f, "  {\"method\": \"%s\", \"mode\": \"%s\", \"bytes\": %zu, \"h2d_gbps\": %.4f, "
                 "\"d2h_gbps\": %.4f, \"reps\": [", r.method.c_str(), r.mode.c_str(), r.bytes,
                 r.median.h2d, r.median.d2h);
    for (size_t k = 0; k < r.reps.size(); ++k) {
      std::fprintf(f, "%s[%.4f, %.4f]", k ? ", " : "", r.reps[k].h2d, r.reps[k].d2h);
    }
    std::fprintf(f, "]}%s\n", i + 1 < results.size() ? "," : "");
  }
  std::fprintf(f, " ],\n \"summary\": {\n");
  const char* methods[] = {"copy_engine", "sm_mapped", "sm_managed", "prefetch"};
  std::printf("\nsummary (best alone over sizes; duplex at the size with the largest sum)\n");
  for (int m = 0; m < 4; ++m) {
    double h_alone = 0, d_alone = 0, dup_h = 0, dup_d = 0;
    size_t dup_bytes = 0;
    for (const Result& r : results) {
      if (r.method != methods[m]) continue;
      if (r.mode == "h2d") h_alone = std::max(h_alone, r.median.h2d);
      if (r.mode == "d2h") d_alone = std::max(d_alone, r.median.d2h);
      if (r.mode == "duplex" && r.median.h2d + r.median.d2h > dup_h + dup_d) {
        dup_h = r.median.h2d;
        dup_d = r.median.d2h;
        dup_bytes = r.bytes;
      }
    }
    std::fprintf(f, "  \"%s\": {\"h2d_alone_gbps\": %.4f, \"d2h_alone_gbps\": %.4f, "
                 "\"duplex_h2d_gbps\": %.4f, \"duplex_d2h_gbps\": %.4f, \"duplex_bytes\": %zu}%s\n",
                 methods[m], h_alone, d_alone, dup_h, dup_d, dup_bytes, m < 3 ? "," : "");
    std::printf("%-12s alone H2D %7.2f D2H %7.2f | both at once H2D %7.2f D2H %7.2f (%zu MiB)\n",
                methods[m], h_alone, d_alone, dup_h, dup_d, dup_bytes / kMiB);
  }
  std::fprintf(f, " }\n}\n");
  if (std::fclose(f) != 0) {
    std::fprintf(stderr, "link_duplex_bench: cannot write %s\n", opt.json.c_str());
    return 1;
  }
  std::printf("%s: %s, CUDA runtime %d driver %d, %.1f s; wrote %s\n", argv[0], gpu.c_str(),
              runtime, driver, seconds, opt.json.c_str());
  return 0;
}
