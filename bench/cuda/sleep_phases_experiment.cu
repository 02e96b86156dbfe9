// Where does a staged sleep/wake of managed memory spend its time, and which
// way of doing each phase is fastest? Lays out a GPT-2 training state (12
// layers x 1536, fp32 parameters + two AdamW moments: 444 tensors packed at
// 512 B like cma's arena) plus a 4 GiB disposable KV cache in one managed
// range, then times, with events, each phase of several ways to sleep (copy
// the kept pages into pinned host memory, discard) and wake (populate, copy
// back), checks every tensor's first and last byte after each wake, and
// times ways to pin the host staging (the first cycle's cost).
// A standalone experiment, built on the GPU machine:
//   nvcc -O2 -std=c++17 -o sp sleep_phases_experiment.cu -lpthread && ./sp
// (result: bench/results/h200_sleep21/ or its successors).
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr size_t kMiB = size_t{1} << 20, kPage = 2 * kMiB;
const cudaMemLocation kDev{cudaMemLocationTypeDevice, 0};
const cudaMemLocation kHost{cudaMemLocationTypeHost, 0};

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

struct Range {
  char* p;
  size_t n;
};

size_t Up(size_t v, size_t a) { return (v + a - 1) / a * a; }
size_t Down(size_t v, size_t a) { return v / a * a; }

// The parameter shapes of GPT-2 (n_layer 12, n_embd 1536), fp32 bytes.
std::vector<size_t> Gpt2Params() {
  const size_t d = 1536, v = 50257, ctx = 1024, f = 4;
  std::vector<size_t> p = {v * d * f, ctx * d * f};
  for (int l = 0; l < 12; ++l) {
    for (size_t n : {d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d})
      p.push_back(n * f);
  }
  p.push_back(d * f);
  p.push_back(d * f);
  return p;
}

double Ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

void Batch(const std::vector<Range>& r, std::vector<void*>* ptrs, std::vector<size_t>* sizes) {
  ptrs->clear();
  sizes->clear();
  for (const Range& x : r) {
    ptrs->push_back(x.p);
    sizes->push_back(x.n);
  }
}

void Discard(const std::vector<Range>& r, cudaStream_t s) {
  if (r.empty()) return;
  std::vector<void*> p;
  std::vector<size_t> n;
  Batch(r, &p, &n);
  CHECK(cudaMemDiscardBatchAsync(p.data(), n.data(), p.size(), 0, s));
}

void Prefetch(const std::vector<Range>& r, cudaMemLocation loc, cudaStream_t s) {
  if (r.empty()) return;
  std::vector<void*> p;
  std::vector<size_t> n;
  Batch(r, &p, &n);
  size_t first = 0;
  CHECK(cudaMemPrefetchBatchAsync(p.data(), n.data(), p.size(), &loc, &first, 1, 0, s));
}

void DiscardAndPrefetch(const std::vector<Range>& r, cudaMemLocation loc, cudaStream_t s) {
  if (r.empty()) return;
  std::vector<void*> p;
  std::vector<size_t> n;
  Batch(r, &p, &n);
  size_t first = 0;
  CHECK(cudaMemDiscardAndPrefetchBatchAsync(p.data(), n.data(), p.size(), &loc, &first, 1, 0, s));
}

// Splits [p, p+n) into chunks of at most `chunk` bytes.
std::vector<Range> Chunks(Range r, size_t chunk) {
  std::vector<Range> out;
  for (size_t o = 0; o < r.n; o += chunk) out.push_back({r.p + o, std::min(chunk, r.n - o)});
  return out;
}

struct State;
// The state's pages copied out to the staging, or back, in 256 MiB pieces.
void CopyOut(State& st, cudaStream_t s);
void CopyBack(State& st, cudaStream_t s, cudaMemcpyKind kind = cudaMemcpyDefault);

struct State {
  char* raw = nullptr;      // the managed range
  char* base = nullptr;     // 2 MiB aligned start of the packed tensors
  size_t total = 0;         // bytes of the managed range
  std::vector<Range> tensors;
  Range kv{};
  Range kept_pages{};       // whole pages covering every tensor
  char* staging = nullptr;  // pinned, kept_pages.n bytes
};

void CopyOut(State& st, cudaStream_t s) {
  for (const Range& c : Chunks(st.kept_pages, 256 * kMiB)) {
    CHECK(cudaMemcpyAsync(st.staging + (c.p - st.kept_pages.p), c.p, c.n, cudaMemcpyDefault, s));
  }
}

void CopyBack(State& st, cudaStream_t s, cudaMemcpyKind kind) {
  for (const Range& c : Chunks(st.kept_pages, 256 * kMiB)) {
    CHECK(cudaMemcpyAsync(c.p, st.staging + (c.p - st.kept_pages.p), c.n, kind, s));
  }
}

uint8_t Mark(size_t i) { return static_cast<uint8_t>(i % 251 + 1); }

void Fill(State& st, cudaStream_t s) {
  for (size_t i = 0; i < st.tensors.size(); ++i)
    CHECK(cudaMemsetAsync(st.tensors[i].p, Mark(i), st.tensors[i].n, s));
  CHECK(cudaMemsetAsync(st.kv.p, 7, st.kv.n, s));
  CHECK(cudaStreamSynchronize(s));
}

// Every tensor's first and last byte, checked on the device.
__global__ void CheckEnds(char* const* starts, const size_t* sizes, int n, int* bad) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint8_t want = static_cast<uint8_t>(i % 251 + 1);
    if (static_cast<uint8_t>(starts[i][0]) != want) atomicAdd(bad, 1);
    if (static_cast<uint8_t>(starts[i][sizes[i] - 1]) != want) atomicAdd(bad, 1);
  }
}

int Verify(State& st) {
  const int n = static_cast<int>(st.tensors.size());
  char** starts = nullptr;
  size_t* sizes = nullptr;
  int* bad = nullptr;
  CHECK(cudaMalloc(&starts, n * sizeof(char*)));
  CHECK(cudaMalloc(&sizes, n * sizeof(size_t)));
  CHECK(cudaMalloc(&bad, sizeof(int)));
  std::vector<char*> hs;
  std::vector<size_t> hn;
  for (const Range& r : st.tensors) {
    hs.push_back(r.p);
    hn.push_back(r.n);
  }
  CHECK(cudaMemcpy(starts, hs.data(), n * sizeof(char*), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(sizes, hn.data(), n * sizeof(size_t), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(bad, 0, sizeof(int)));
  CheckEnds<<<4, 128>>>(starts, sizes, n, bad);
  int h = 0;
  CHECK(cudaMemcpy(&h, bad, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(starts));
  CHECK(cudaFree(sizes));
  CHECK(cudaFree(bad));
  return h;
}

size_t StateBytes(const State& st) {
  size_t n = 0;
  for (const Range& r : st.tensors) n += r.n;
  return n;
}

// ---- ways to sleep and wake ----

// cma today: per tensor, its whole pages are copied to the staging and
// discarded; the partial pages at its ends migrate to the host.
void SleepPerTensor(State& st, cudaStream_t s, double* copy_ms, double* migrate_ms,
                    double* discard_ms, std::vector<Range>* whole_out) {
  std::vector<Range> whole, edges;
  for (const Range& t : st.tensors) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(t.p), e = a + t.n;
    const uintptr_t wa = Up(a, kPage), we = Down(e, kPage);
    if (wa >= we) {
      edges.push_back(t);
      continue;
    }
    if (a < wa) edges.push_back({t.p, wa - a});
    whole.push_back({reinterpret_cast<char*>(wa), we - wa});
    if (we < e) edges.push_back({reinterpret_cast<char*>(we), e - we});
  }
  cudaEvent_t ev[4];
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  CHECK(cudaEventRecord(ev[0], s));
  for (const Range& w : whole) {
    CHECK(cudaMemcpyAsync(st.staging + (w.p - st.kept_pages.p), w.p, w.n, cudaMemcpyDefault, s));
  }
  CHECK(cudaEventRecord(ev[1], s));
  Prefetch(edges, kHost, s);
  CHECK(cudaEventRecord(ev[2], s));
  std::vector<Range> d = whole;
  d.push_back(st.kv);
  Discard(d, s);
  CHECK(cudaEventRecord(ev[3], s));
  CHECK(cudaStreamSynchronize(s));
  *copy_ms = Ms(ev[0], ev[1]);
  *migrate_ms = Ms(ev[1], ev[2]);
  *discard_ms = Ms(ev[2], ev[3]);
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
  *whole_out = whole;
}

void WakePerTensor(State& st, const std::vector<Range>& whole, cudaStream_t s, double* pop_ms,
                   double* copy_ms) {
  cudaEvent_t ev[3];
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  CHECK(cudaEventRecord(ev[0], s));
  CHECK(cudaMemPrefetchAsync(st.kept_pages.p, st.kept_pages.n, kDev, 0, s));  // the edges
  std::vector<Range> d = whole;
  d.push_back(st.kv);
  DiscardAndPrefetch(d, kDev, s);
  CHECK(cudaEventRecord(ev[1], s));
  for (const Range& w : whole) {
    CHECK(cudaMemcpyAsync(w.p, st.staging + (w.p - st.kept_pages.p), w.n, cudaMemcpyDefault, s));
  }
  CHECK(cudaEventRecord(ev[2], s));
  CHECK(cudaStreamSynchronize(s));
  *pop_ms = Ms(ev[0], ev[1]);
  *copy_ms = Ms(ev[1], ev[2]);
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
}

// One run of whole pages covers every tensor (edges included: no page is
// shared with anything else that lives): copied in `chunk` pieces.
void SleepRun(State& st, size_t chunk, cudaStream_t s, double* copy_ms, double* discard_ms) {
  cudaEvent_t ev[3];
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  CHECK(cudaEventRecord(ev[0], s));
  for (const Range& c : Chunks(st.kept_pages, chunk)) {
    CHECK(cudaMemcpyAsync(st.staging + (c.p - st.kept_pages.p), c.p, c.n, cudaMemcpyDefault, s));
  }
  CHECK(cudaEventRecord(ev[1], s));
  Discard({st.kept_pages, st.kv}, s);
  CHECK(cudaEventRecord(ev[2], s));
  CHECK(cudaStreamSynchronize(s));
  *copy_ms = Ms(ev[0], ev[1]);
  *discard_ms = Ms(ev[1], ev[2]);
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
}

enum class Populate { kDiscardAndPrefetch, kPrefetch };

void WakeRun(State& st, size_t chunk, Populate how, cudaStream_t s, double* pop_ms,
             double* copy_ms) {
  cudaEvent_t ev[3];
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  CHECK(cudaEventRecord(ev[0], s));
  if (how == Populate::kDiscardAndPrefetch) DiscardAndPrefetch({st.kept_pages, st.kv}, kDev, s);
  if (how == Populate::kPrefetch) Prefetch({st.kept_pages, st.kv}, kDev, s);
  CHECK(cudaEventRecord(ev[1], s));
  for (const Range& c : Chunks(st.kept_pages, chunk)) {
    CHECK(cudaMemcpyAsync(c.p, st.staging + (c.p - st.kept_pages.p), c.n, cudaMemcpyDefault, s));
  }
  CHECK(cudaEventRecord(ev[2], s));
  CHECK(cudaStreamSynchronize(s));
  *pop_ms = Ms(ev[0], ev[1]);
  *copy_ms = Ms(ev[1], ev[2]);
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
}

// Population of chunk i on `pop` overlaps the copy of chunk i-1 on `s`.
void WakePipelined(State& st, size_t chunk, cudaStream_t s, cudaStream_t pop, double* total_ms) {
  const std::vector<Range> cs = Chunks(st.kept_pages, chunk);
  std::vector<cudaEvent_t> ready(cs.size());
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a, s));
  CHECK(cudaStreamWaitEvent(pop, a, 0));
  for (size_t i = 0; i < cs.size(); ++i) {
    CHECK(cudaEventCreateWithFlags(&ready[i], cudaEventDisableTiming));
    DiscardAndPrefetch({cs[i]}, kDev, pop);
    CHECK(cudaEventRecord(ready[i], pop));
  }
  DiscardAndPrefetch({st.kv}, kDev, pop);
  for (size_t i = 0; i < cs.size(); ++i) {
    CHECK(cudaStreamWaitEvent(s, ready[i], 0));
    CHECK(cudaMemcpyAsync(cs[i].p, st.staging + (cs[i].p - st.kept_pages.p), cs[i].n,
                          cudaMemcpyDefault, s));
  }
  cudaEvent_t done;
  CHECK(cudaEventCreate(&done));
  CHECK(cudaEventRecord(done, pop));
  CHECK(cudaStreamWaitEvent(s, done, 0));
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaStreamSynchronize(s));
  *total_ms = Ms(a, b);
  for (auto& e : ready) CHECK(cudaEventDestroy(e));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  CHECK(cudaEventDestroy(done));
}

// The state's pages populated then copied back on `s`, 256 MiB copies;
// the KV cache's pages populated meanwhile on `kv_stream` (or after the
// copies on `s` when null): does its population overlap the copies, and
// do the copies keep their speed?
void WakeKvAside(State& st, cudaStream_t s, cudaStream_t kv_stream, double* state_pop_ms,
                 double* copy_ms, double* total_ms) {
  cudaEvent_t ev[4];
  for (auto& e : ev) CHECK(cudaEventCreate(&e));
  CHECK(cudaEventRecord(ev[0], s));
  if (kv_stream != nullptr) {
    CHECK(cudaStreamWaitEvent(kv_stream, ev[0], 0));
    DiscardAndPrefetch({st.kv}, kDev, kv_stream);
  }
  Prefetch({st.kept_pages}, kDev, s);
  CHECK(cudaEventRecord(ev[1], s));
  CopyBack(st, s);
  CHECK(cudaEventRecord(ev[2], s));
  if (kv_stream != nullptr) {
    cudaEvent_t kv_done;
    CHECK(cudaEventCreateWithFlags(&kv_done, cudaEventDisableTiming));
    CHECK(cudaEventRecord(kv_done, kv_stream));
    CHECK(cudaStreamWaitEvent(s, kv_done, 0));
    CHECK(cudaEventDestroy(kv_done));
  } else {
    DiscardAndPrefetch({st.kv}, kDev, s);
  }
  CHECK(cudaEventRecord(ev[3], s));
  CHECK(cudaStreamSynchronize(s));
  *state_pop_ms = Ms(ev[0], ev[1]);
  *copy_ms = Ms(ev[1], ev[2]);
  *total_ms = Ms(ev[0], ev[3]);
  for (auto& e : ev) CHECK(cudaEventDestroy(e));
}

// ---- pinning the staging ----

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void* MapTouched(size_t n, unsigned threads) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  madvise(p, n, MADV_HUGEPAGE);
  if (threads == 0) return p;
  std::vector<std::thread> ts;
  const size_t part = Up(n / threads, kPage);
  for (unsigned t = 0; t < threads; ++t) {
    ts.emplace_back([=] {
      auto* c = static_cast<volatile char*>(p);
      for (size_t o = t * part; o < std::min(n, (t + 1) * part); o += 4096) c[o] = 0;
    });
  }
  for (auto& t : ts) t.join();
  return p;
}

void PinWays(size_t bytes) {
  const size_t chunk = 256 * kMiB, n = Up(bytes, chunk) / chunk;
  auto report = [&](const char* what, double s) {
    printf("pin %-52s %6.3f s  %6.1f GB/s\n", what, s, n * chunk / s / 1e9);
  };
  {
    std::vector<void*> ps(n);
    auto t0 = std::chrono::steady_clock::now();
    for (auto& p : ps) CHECK(cudaHostAlloc(&p, chunk, cudaHostAllocDefault));
    report("cudaHostAlloc, 256 MiB chunks", Seconds(t0));
    for (auto p : ps) CHECK(cudaFreeHost(p));
  }
  for (unsigned touch : {0u, 16u}) {
    std::vector<void*> ps(n);
    auto t0 = std::chrono::steady_clock::now();
    for (auto& p : ps) {
      p = MapTouched(chunk, touch);
      CHECK(cudaHostRegister(p, chunk, cudaHostRegisterDefault));
    }
    report(touch ? "mmap+THP, 16 threads touch, register; 256 MiB chunks"
                 : "mmap+THP, register (no touch); 256 MiB chunks",
           Seconds(t0));
    for (auto p : ps) {
      CHECK(cudaHostUnregister(p));
      munmap(p, chunk);
    }
  }
  for (unsigned workers : {4u, 8u}) {
    std::vector<void*> ps(n);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    for (unsigned w = 0; w < workers; ++w) {
      ts.emplace_back([&, w] {
        for (size_t i = w; i < n; i += workers) {
          ps[i] = MapTouched(chunk, 2);
          CHECK(cudaHostRegister(ps[i], chunk, cudaHostRegisterDefault));
        }
      });
    }
    for (auto& t : ts) t.join();
    char what[96];
    snprintf(what, sizeof what, "%u threads each map+touch+register its chunks", workers);
    report(what, Seconds(t0));
    for (auto p : ps) {
      CHECK(cudaHostUnregister(p));
      munmap(p, chunk);
    }
  }
}

const auto kStart = std::chrono::steady_clock::now();
void Section(const char* what) { printf("[%6.1f s] %s\n", Seconds(kStart), what); }

template <typename F>
void Cycles(const char* what, State& st, int cycles, F f) {
  for (int c = 0; c < cycles; ++c) {
    f(c);
    const int bad = Verify(st);
    if (bad) printf("  %s cycle %d: %d WRONG bytes\n", what, c, bad);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // `sp kv`: only the KV-beside-copies section (after the setup); `sp
  // delay`: only the wake-after-a-pause section; `sp gap`: only the ways
  // to wake right after a sleep; `sp mark`: only the host function after
  // the discards; `sp order`: only the wake orders after a pause; `sp
  // fence`: only the wake ordered after the driver's work behind the discards.
  const std::string only = argc < 2 ? "" : argv[1];
  const bool all = only.empty();
  setvbuf(stdout, nullptr, _IOLBF, 0);  // a timeout must not lose what was measured
  CHECK(cudaFree(nullptr));
  State st;
  std::vector<size_t> sizes;
  for (int k = 0; k < 3; ++k) {
    for (size_t n : Gpt2Params()) sizes.push_back(n);
  }
  size_t packed = 0;
  for (size_t n : sizes) packed += Up(n, 512);
  const size_t kv_bytes = size_t{4096} * kMiB;
  st.total = Up(packed, kPage) + kPage + kv_bytes + 2 * kPage;
  CHECK(cudaMallocManaged(&st.raw, st.total));
  char* raw = st.raw;
  CHECK(cudaMemAdvise(raw, st.total, cudaMemAdviseSetPreferredLocation, kDev));
  // An arena starts its first block 4 KiB into a page so that edges are
  // shared, as in cma's (blocks do not sit on page boundaries).
  st.base = reinterpret_cast<char*>(Up(reinterpret_cast<uintptr_t>(raw), kPage)) + 4096;
  char* at = st.base;
  for (size_t n : sizes) {
    st.tensors.push_back({at, n});
    at += Up(n, 512);
  }
  st.kept_pages = {reinterpret_cast<char*>(Down(reinterpret_cast<uintptr_t>(st.base), kPage)), 0};
  st.kept_pages.n = Up(at - st.kept_pages.p, kPage);
  // The KV cache shares no page with the state (cma marks it disposable; a
  // shared page would be kept).
  st.kv = {st.kept_pages.p + st.kept_pages.n, kv_bytes};
  CHECK(cudaHostAlloc(reinterpret_cast<void**>(&st.staging), st.kept_pages.n, 0));
  cudaStream_t s, pop;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&pop, cudaStreamNonBlocking));
  CHECK(cudaMemPrefetchAsync(raw, st.total, kDev, 0, s));
  Fill(st, s);
  const double gb = StateBytes(st) / 1e9;
  printf("state: %zu tensors, %.3f GB (pages %.3f GB), kv %.3f GB\n", st.tensors.size(), gb,
         st.kept_pages.n / 1e9, kv_bytes / 1e9);

  Section("copy floor");
  // Copy floor: the same bytes between cudaMalloc memory and the staging.
  if (all) {
    char* d = nullptr;
    CHECK(cudaMalloc(&d, st.kept_pages.n));
    cudaEvent_t a, b, c;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventCreate(&c));
    for (int r = 0; r < 3; ++r) {
      CHECK(cudaEventRecord(a, s));
      CHECK(cudaMemcpyAsync(st.staging, d, st.kept_pages.n, cudaMemcpyDefault, s));
      CHECK(cudaEventRecord(b, s));
      CHECK(cudaMemcpyAsync(d, st.staging, st.kept_pages.n, cudaMemcpyDefault, s));
      CHECK(cudaEventRecord(c, s));
      CHECK(cudaStreamSynchronize(s));
      printf("floor (cudaMalloc<->pinned, one copy): D2H %.1f ms (%.1f GB/s)  H2D %.1f ms (%.1f "
             "GB/s)\n",
             Ms(a, b), st.kept_pages.n / Ms(a, b) / 1e6, Ms(b, c), st.kept_pages.n / Ms(b, c) / 1e6);
    }
    // Resident managed <-> pinned, 64 MiB pieces (no population involved).
    for (int r = 0; r < 2; ++r) {
      CHECK(cudaEventRecord(a, s));
      for (const Range& x : Chunks(st.kept_pages, 64 * kMiB))
        CHECK(cudaMemcpyAsync(st.staging + (x.p - st.kept_pages.p), x.p, x.n, cudaMemcpyDefault, s));
      CHECK(cudaEventRecord(b, s));
      for (const Range& x : Chunks(st.kept_pages, 64 * kMiB))
        CHECK(cudaMemcpyAsync(x.p, st.staging + (x.p - st.kept_pages.p), x.n, cudaMemcpyDefault, s));
      CHECK(cudaEventRecord(c, s));
      CHECK(cudaStreamSynchronize(s));
      printf("resident managed<->pinned, 64 MiB copies: D2H %.1f ms  H2D %.1f ms\n", Ms(a, b),
             Ms(b, c));
    }
    CHECK(cudaFree(d));
  }

  Section("per-tensor staging (cma today)");
  if (all) Cycles("per-tensor", st, 3, [&](int c) {
    double cp, mig, dis, pop, cb;
    std::vector<Range> whole;
    auto t0 = std::chrono::steady_clock::now();
    SleepPerTensor(st, s, &cp, &mig, &dis, &whole);
    const double sleep_s = Seconds(t0);
    t0 = std::chrono::steady_clock::now();
    WakePerTensor(st, whole, s, &pop, &cb);
    const double wake_s = Seconds(t0);
    printf("per-tensor c%d: sleep %.1f ms (%.1f GB/s) = copy %.1f + migrate edges %.1f + discard "
           "%.1f | wake %.1f ms (%.1f GB/s) = populate %.1f + copy %.1f\n",
           c, sleep_s * 1e3, gb / sleep_s, cp, mig, dis, wake_s * 1e3, gb / wake_s, pop, cb);
  });
  Section("page runs");
  for (size_t chunk : {64 * kMiB, 256 * kMiB, size_t{1} << 40}) {
    if (!all) break;
    for (Populate how : {Populate::kDiscardAndPrefetch, Populate::kPrefetch}) {
      const char* hn = how == Populate::kPrefetch ? "prefetch" : "discard+prefetch";
      Cycles("run", st, 2, [&](int c) {
        double cp, dis, pop, cb;
        auto t0 = std::chrono::steady_clock::now();
        SleepRun(st, chunk, s, &cp, &dis);
        const double sleep_s = Seconds(t0);
        t0 = std::chrono::steady_clock::now();
        WakeRun(st, chunk, how, s, &pop, &cb);
        const double wake_s = Seconds(t0);
        printf("run chunk %5zu MiB, %-16s c%d: sleep %.1f ms (%.1f GB/s) = copy %.1f + discard "
               "%.1f | wake %.1f ms (%.1f GB/s) = populate %.1f + copy %.1f\n",
               std::min(chunk, st.kept_pages.n) / kMiB, hn, c, sleep_s * 1e3, gb / sleep_s, cp,
               dis, wake_s * 1e3, gb / wake_s, pop, cb);
      });
    }
  }
  Section("wake after a pause, populating twice");
  for (int delay_ms : {0, 0, 5, 5, 50, 50, 300, 300}) {
    if (!all && only != "delay") break;
    Cycles("delay", st, 1, [&](int) {
      double cp, dis;
      SleepRun(st, 256 * kMiB, s, &cp, &dis);
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      cudaEvent_t ev[4];
      for (auto& e : ev) CHECK(cudaEventCreate(&e));
      auto t0 = std::chrono::steady_clock::now();
      CHECK(cudaEventRecord(ev[0], s));
      DiscardAndPrefetch({st.kept_pages, st.kv}, kDev, s);
      CHECK(cudaEventRecord(ev[1], s));
      CHECK(cudaStreamSynchronize(s));
      const double call1 = Seconds(t0) * 1e3;
      // A second population: free if the first populated everything.
      Prefetch({st.kept_pages, st.kv}, kDev, s);
      CHECK(cudaEventRecord(ev[2], s));
      CopyBack(st, s);
      CHECK(cudaEventRecord(ev[3], s));
      CHECK(cudaStreamSynchronize(s));
      printf("pause %3d ms: populate %.1f ms (host %.1f), populate again %.1f, copy %.1f ms\n",
             delay_ms, Ms(ev[0], ev[1]), call1, Ms(ev[1], ev[2]), Ms(ev[2], ev[3]));
      for (auto& e : ev) CHECK(cudaEventDestroy(e));
    });
  }
  Section("wake right after a sleep: ways to avoid copies at fault speed");
  // Round robin over the ways so that drift does not favour one; every
  // cycle sleeps (256 MiB copies out, discard, synchronise) and wakes at
  // once unless the way pauses. "touch" writes one byte of every state
  // page with a strided memset (a kernel: its faults are the replayable
  // kind) between the population and the copies; "advise" states the
  // preferred location again before populating; "sync" synchronises
  // between population and copies; "htod" names the copy's direction.
  {
    const char* ways[] = {"now", "pause5", "touch", "advise", "sync", "htod"};
    const int rounds = only == "gap" ? 8 : 0;
    const size_t pages = st.kept_pages.n / kPage;
    for (int r = 0; r < rounds; ++r) {
      for (const char* way : ways) {
        const std::string w = way;
        Cycles(way, st, 1, [&](int) {
          double cp, dis;
          SleepRun(st, 256 * kMiB, s, &cp, &dis);
          if (w == "pause5") std::this_thread::sleep_for(std::chrono::milliseconds(5));
          if (w == "advise") {
            CHECK(cudaMemAdvise(st.kept_pages.p, st.kept_pages.n + st.kv.n,
                                cudaMemAdviseSetPreferredLocation, kDev));
          }
          cudaEvent_t ev[4];
          for (auto& e : ev) CHECK(cudaEventCreate(&e));
          auto t0 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(ev[0], s));
          DiscardAndPrefetch({st.kept_pages, st.kv}, kDev, s);
          CHECK(cudaEventRecord(ev[1], s));
          if (w == "touch") CHECK(cudaMemset2DAsync(st.kept_pages.p, kPage, 0, 1, pages, s));
          if (w == "sync") CHECK(cudaStreamSynchronize(s));
          CHECK(cudaEventRecord(ev[2], s));
          CopyBack(st, s, w == "htod" ? cudaMemcpyHostToDevice : cudaMemcpyDefault);
          CHECK(cudaEventRecord(ev[3], s));
          CHECK(cudaStreamSynchronize(s));
          const double wake_ms = Seconds(t0) * 1e3;
          const double copy = Ms(ev[2], ev[3]);
          printf("gap r%d %-7s: wake %7.1f ms = populate %.1f + between %.1f + copy %.1f%s\n", r,
                 way, wake_ms, Ms(ev[0], ev[1]), Ms(ev[1], ev[2]), copy,
                 copy > 200 ? "  FAULT SPEED" : "");
          for (auto& e : ev) CHECK(cudaEventDestroy(e));
        });
      }
    }
  }
  Section("a host function after the discards");
  // Does a host function queued after the discards (cma's settle mark)
  // lengthen the sleep, and does the wake right after it still copy at
  // fault speed? "plain": no host function, wake at once; "mark": a host
  // function after the discards, wake at once; "mark+hold": also one
  // before the population that waits out 5 ms since the mark ran (cma's
  // wake_settle_ms:5); "pause5": no host function, 5 ms on the host;
  // "side+hold": the mark on a side stream that waits for the discards.
  {
    const char* ways[] = {"plain", "mark", "mark+hold", "pause5", "side+hold"};
    const int rounds = only == "mark" ? 8 : 0;
    cudaEvent_t discarded;
    CHECK(cudaEventCreateWithFlags(&discarded, cudaEventDisableTiming));
    static std::atomic<int64_t> mark_ns{0};
    static std::atomic<int> held{0};
    auto now_ns = [] {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
    for (int r = 0; r < rounds; ++r) {
      for (const char* way : ways) {
        const std::string w = way;
        Cycles(way, st, 1, [&](int) {
          cudaEvent_t ev[5];
          for (auto& e : ev) CHECK(cudaEventCreate(&e));
          auto t0 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(ev[0], s));
          CopyOut(st, s);
          Discard({st.kept_pages, st.kv}, s);
          CHECK(cudaEventRecord(ev[1], s));
          if (w == "side+hold") {
            // The mark on a side stream that waits for the discards: the
            // sleep's own stream holds no host function.
            CHECK(cudaEventRecord(discarded, s));
            CHECK(cudaStreamWaitEvent(pop, discarded, 0));
            CHECK(cudaLaunchHostFunc(pop, [](void*) { mark_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count()); }, nullptr));
          } else if (w != "plain" && w != "pause5") {
            CHECK(cudaLaunchHostFunc(s, [](void*) { mark_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count()); }, nullptr));
          }
          CHECK(cudaStreamSynchronize(s));
          const double sleep_ms = Seconds(t0) * 1e3;
          if (w == "pause5") std::this_thread::sleep_for(std::chrono::milliseconds(5));
          held = 0;
          const int64_t woke_at = now_ns();
          t0 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(ev[2], s));
          if (w == "mark+hold" || w == "side+hold") {
            CHECK(cudaLaunchHostFunc(s, [](void*) {
              const int64_t left = mark_ns.load() + 5000000 -
                  std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
              if (left > 0) { held = 1; std::this_thread::sleep_for(std::chrono::nanoseconds(left)); }
            }, nullptr));
          }
          DiscardAndPrefetch({st.kept_pages, st.kv}, kDev, s);
          CHECK(cudaEventRecord(ev[3], s));
          CopyBack(st, s);
          CHECK(cudaEventRecord(ev[4], s));
          CHECK(cudaStreamSynchronize(s));
          const double wake_ms = Seconds(t0) * 1e3;
          const double copy = Ms(ev[3], ev[4]);
          printf("mark r%d %-9s: sleep %6.1f ms (stream %.1f, mark %+.1f ms before the wake) | "
                 "wake %7.1f ms = populate %.1f + copy %.1f%s%s\n",
                 r, way, sleep_ms, Ms(ev[0], ev[1]),
                 w == "plain" || w == "pause5" ? 0.0 : (woke_at - mark_ns.load()) / 1e6, wake_ms,
                 Ms(ev[2], ev[3]), copy, held ? " (held)" : "", copy > 200 ? "  FAULT SPEED" : "");
          for (auto& e : ev) CHECK(cudaEventDestroy(e));
        });
      }
    }
  }
  Section("wake orders after a 5 ms pause");
  // cma's Wake populates the KV cache (discard-and-prefetch) before the
  // state's pages (prefetch) and then copies; does that order, after the
  // settle pause, still copy at fault speed, where one call for both does
  // not? "cma": KV, state, copies; "cma, no pause": the same at once;
  // "one call": both in one discard-and-prefetch, copies; "state first":
  // the state's pages, copies, then the KV cache.
  {
    const char* ways[] = {"cma", "cma, no pause", "one call", "state first"};
    const int rounds = only == "order" ? 10 : 0;
    for (int r = 0; r < rounds; ++r) {
      for (const char* way : ways) {
        const std::string w = way;
        Cycles(way, st, 1, [&](int) {
          double cp, dis;
          SleepRun(st, 256 * kMiB, s, &cp, &dis);
          if (w != "cma, no pause") std::this_thread::sleep_for(std::chrono::milliseconds(5));
          cudaEvent_t ev[3];
          for (auto& e : ev) CHECK(cudaEventCreate(&e));
          auto t0 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(ev[0], s));
          if (w == "one call") {
            DiscardAndPrefetch({st.kept_pages, st.kv}, kDev, s);
          } else if (w == "state first") {
            Prefetch({st.kept_pages}, kDev, s);
          } else {
            DiscardAndPrefetch({st.kv}, kDev, s);
            Prefetch({st.kept_pages}, kDev, s);
          }
          CHECK(cudaEventRecord(ev[1], s));
          CopyBack(st, s);
          CHECK(cudaEventRecord(ev[2], s));
          if (w == "state first") DiscardAndPrefetch({st.kv}, kDev, s);
          CHECK(cudaStreamSynchronize(s));
          const double wake_ms = Seconds(t0) * 1e3;
          const double copy = Ms(ev[1], ev[2]);
          printf("order r%d %-13s: wake %7.1f ms = populate %.1f + copy %.1f%s\n", r, way,
                 wake_ms, Ms(ev[0], ev[1]), copy, copy > 200 ? "  FAULT SPEED" : "");
          for (auto& e : ev) CHECK(cudaEventDestroy(e));
        });
      }
    }
  }
  Section("the wake ordered after the driver's work behind the discards");
  // A host function runs only once the driver's work behind a discard is
  // done (runs K, L): queued on a side stream that waits for the sleep's
  // discards, and followed there by an event, it marks that moment without
  // holding the sleep's stream; the wake's stream waits for the event
  // before populating. "fenced" against "at once" (cma's order: KV, state,
  // copies), alternating.
  {
    const int rounds = only == "fence" ? 12 : 0;
    cudaEvent_t discarded, behind;
    CHECK(cudaEventCreateWithFlags(&discarded, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&behind, cudaEventDisableTiming));
    for (int r = 0; r < rounds; ++r) {
      for (const bool fenced : {false, true}) {
        Cycles("fence", st, 1, [&](int) {
          cudaEvent_t ev[4];
          for (auto& e : ev) CHECK(cudaEventCreate(&e));
          auto t0 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(ev[0], s));
          CopyOut(st, s);
          Discard({st.kept_pages, st.kv}, s);
          if (fenced) {
            CHECK(cudaEventRecord(discarded, s));
            CHECK(cudaStreamWaitEvent(pop, discarded, 0));
            CHECK(cudaLaunchHostFunc(pop, [](void*) {}, nullptr));
            CHECK(cudaEventRecord(behind, pop));
          }
          CHECK(cudaStreamSynchronize(s));
          const double sleep_ms = Seconds(t0) * 1e3;
          t0 = std::chrono::steady_clock::now();
          CHECK(cudaEventRecord(ev[1], s));
          if (fenced) CHECK(cudaStreamWaitEvent(s, behind, 0));
          DiscardAndPrefetch({st.kv}, kDev, s);
          Prefetch({st.kept_pages}, kDev, s);
          CHECK(cudaEventRecord(ev[2], s));
          CopyBack(st, s);
          CHECK(cudaEventRecord(ev[3], s));
          CHECK(cudaStreamSynchronize(s));
          const double wake_ms = Seconds(t0) * 1e3;
          const double copy = Ms(ev[2], ev[3]);
          printf("fence r%d %-7s: sleep %6.1f ms | wake %7.1f ms = wait+populate %.1f + copy %.1f%s\n",
                 r, fenced ? "fenced" : "at once", sleep_ms, wake_ms, Ms(ev[1], ev[2]), copy,
                 copy > 200 ? "  FAULT SPEED" : "");
          for (auto& e : ev) CHECK(cudaEventDestroy(e));
        });
      }
    }
    CHECK(cudaEventDestroy(discarded));
    CHECK(cudaEventDestroy(behind));
  }
  Section("kv population beside the copies");
  for (const bool aside : {false, true, false, true}) {
    if (!all && only != "kv") break;
    Cycles("kv aside", st, 1, [&](int) {
      double cp, dis, state_pop, copy, total;
      SleepRun(st, 256 * kMiB, s, &cp, &dis);
      auto t0 = std::chrono::steady_clock::now();
      WakeKvAside(st, s, aside ? pop : nullptr, &state_pop, &copy, &total);
      const double wake_s = Seconds(t0);
      printf("wake, kv populated %-22s: %.1f ms (%.1f GB/s) = state pages %.1f + copy %.1f, "
             "events %.1f\n",
             aside ? "on a side stream" : "after, on the stream", wake_s * 1e3, gb / wake_s,
             state_pop, copy, total);
    });
  }
  Section("pipelined wake");
  for (size_t chunk : {64 * kMiB, 256 * kMiB}) {
    if (!all) break;
    Cycles("pipelined", st, 2, [&](int c) {
      double cp, dis, total;
      auto t0 = std::chrono::steady_clock::now();
      SleepRun(st, chunk, s, &cp, &dis);
      const double sleep_s = Seconds(t0);
      t0 = std::chrono::steady_clock::now();
      WakePipelined(st, chunk, s, pop, &total);
      const double wake_s = Seconds(t0);
      printf("pipelined wake, chunk %zu MiB c%d: sleep %.1f ms | wake %.1f ms (%.1f GB/s), "
             "events %.1f ms\n",
             chunk / kMiB, c, sleep_s * 1e3, wake_s * 1e3, gb / wake_s, total);
    });
  }
  Section("fault-populated copy");
  // Copying straight into discarded pages (population by fault), on 512 MiB.
  if (all) {
    Range part{st.kept_pages.p, 512 * kMiB};
    Discard({part}, s);
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaMemcpyAsync(part.p, st.staging, part.n, cudaMemcpyDefault, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaStreamSynchronize(s));
    printf("copy into 512 MiB of discarded pages (fault-populated): %.1f ms (%.1f GB/s)\n",
           Ms(a, b), part.n / Ms(a, b) / 1e6);
  }
  Section("pinning");
  if (all) PinWays(st.kept_pages.n);
  Section("end");
  CHECK(cudaFreeHost(st.staging));
  CHECK(cudaFree(raw));
  return 0;
}
