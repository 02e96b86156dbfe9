// The managed-memory migration suite of cma_bench on CUDA: first device
// writes under each placement policy, resident bandwidth, zero-copy moves,
// and what users would otherwise do (raw prefetch, pinned copies), measured
// in one run on 2 GiB blocks. Each case counts the policy's own
// prefetch/discard time: the clock starts before Allocate or Move.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/caching_managed_allocator.h"
#include "bench/cuda/cuda_bench.h"
#include "backends/cuda/cuda_status.h"
#include "bench/cuda/kernels.h"

namespace cma {
namespace {

constexpr std::size_t kBytes = std::size_t{2} << 30;
constexpr int kReps = 3;
using Clock = std::chrono::steady_clock;

#define CMA_RETURN_IF_ERROR(expr)       \
  do {                                  \
    const absl::Status cma_s_ = (expr); \
    if (!cma_s_.ok()) return cma_s_;    \
  } while (0)

double GBps(double seconds) { return static_cast<double>(kBytes) / seconds / 1e9; }

// Median over kReps of the seconds `timed` takes; `setup` runs untimed before
// each repetition.
absl::StatusOr<double> MedianSeconds(const std::function<absl::Status()>& setup,
                                     const std::function<absl::Status()>& timed,
                                     const std::function<absl::Status()>& teardown) {
  std::vector<double> t;
  for (int r = 0; r < kReps; ++r) {
    CMA_RETURN_IF_ERROR(setup());
    const auto t0 = Clock::now();
    CMA_RETURN_IF_ERROR(timed());
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    CMA_RETURN_IF_ERROR(teardown());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Suite {
  Backend& backend;
  int device;
  Stream stream;
  nlohmann::json first_touch = nlohmann::json::array();

  absl::Status Sync() { return backend.SynchronizeStream(stream); }

  // Allocates kBytes into `p` and writes all of it from the device: the
  // "first device write" every first-touch case times.
  absl::Status AllocateAndFill(CachingManagedAllocator& alloc, void*& p, std::uint32_t seed) {
    absl::StatusOr<void*> a = alloc.Allocate(kBytes, device, stream);
    if (!a.ok()) return a.status();
    p = *a;
    CMA_RETURN_IF_ERROR(LaunchFill(p, kBytes, seed, stream));
    return Sync();
  }

  absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> Make(const std::string& config) {
    return CachingManagedAllocator::Create(backend, config);
  }

  // First device write into a block from a fresh segment.
  absl::Status FreshSegment(const std::string& policy) {
    auto alloc = Make(absl::StrCat("prefetch:", policy));
    if (!alloc.ok()) return alloc.status();
    void* p = nullptr;
    auto secs = MedianSeconds(
        [] { return absl::OkStatus(); },
        [&] { return AllocateAndFill(**alloc, p, 1); },
        [&]() -> absl::Status {
          CMA_RETURN_IF_ERROR((*alloc)->Free(p));
          return (*alloc)->EmptyCache();  // the next repetition starts fresh again
        });
    if (!secs.ok()) return secs.status();
    first_touch.push_back({{"case", "fresh_segment"}, {"policy", policy}, {"GBps", GBps(*secs)}});
    return absl::OkStatus();
  }

  // First device write into a cached block last used on this device; also
  // the resident write bandwidth of the same kernel.
  absl::StatusOr<double> ReusedSameDevice() {
    auto alloc = Make("");
    if (!alloc.ok()) return alloc.status();
    void* p = *(*alloc)->Allocate(kBytes, device, stream);
    CMA_RETURN_IF_ERROR(LaunchFill(p, kBytes, 1, stream));
    CMA_RETURN_IF_ERROR(Sync());
    CMA_RETURN_IF_ERROR((*alloc)->Free(p));
    auto secs = MedianSeconds(
        [] { return absl::OkStatus(); },
        [&] { return AllocateAndFill(**alloc, p, 2); },
        [&] { return (*alloc)->Free(p); });
    if (!secs.ok()) return secs.status();
    first_touch.push_back({{"case", "reused_same_device"}, {"policy", "on_alloc"},
                           {"GBps", GBps(*secs)}});
    p = *(*alloc)->Allocate(kBytes, device, stream);
    auto resident = MedianSeconds(
        [] { return absl::OkStatus(); },
        [&]() -> absl::Status {
          CMA_RETURN_IF_ERROR(LaunchFill(p, kBytes, 3, stream));
          return Sync();
        },
        [] { return absl::OkStatus(); });
    CMA_RETURN_IF_ERROR((*alloc)->Free(p));
    if (!resident.ok()) return resident.status();
    return GBps(*resident);
  }

  // First device write into a cached block last moved to the host: with
  // prefetch:on_alloc its stale contents are discarded, not migrated back.
  absl::Status ReusedAfterHost(const std::string& policy) {
    auto alloc = Make(absl::StrCat("prefetch:", policy));
    if (!alloc.ok()) return alloc.status();
    void* p = nullptr;
    auto secs = MedianSeconds(
        [&]() -> absl::Status {
          CMA_RETURN_IF_ERROR(AllocateAndFill(**alloc, p, 4));
          CMA_RETURN_IF_ERROR((*alloc)->Move(p, Location::Host(), stream));
          CMA_RETURN_IF_ERROR(Sync());
          return (*alloc)->Free(p);
        },
        [&] { return AllocateAndFill(**alloc, p, 5); },
        [&] { return (*alloc)->Free(p); });
    if (!secs.ok()) return secs.status();
    first_touch.push_back(
        {{"case", "reused_after_host_dead"}, {"policy", policy}, {"GBps", GBps(*secs)}});
    return absl::OkStatus();
  }

  // Zero-copy moves of live data, both directions.
  absl::Status Moves(nlohmann::json& out) {
    auto alloc = Make("");
    if (!alloc.ok()) return alloc.status();
    void* p = *(*alloc)->Allocate(kBytes, device, stream);
    CMA_RETURN_IF_ERROR(LaunchFill(p, kBytes, 6, stream));
    CMA_RETURN_IF_ERROR(Sync());
    auto d2h = MedianSeconds(
        [&] { return (*alloc)->Move(p, Location::Device(device), stream).ok() ? Sync()
                                                                            : absl::InternalError("move"); },
        [&]() -> absl::Status {
          CMA_RETURN_IF_ERROR((*alloc)->Move(p, Location::Host(), stream));
          return Sync();
        },
        [] { return absl::OkStatus(); });
    auto h2d = MedianSeconds(
        [&] { return (*alloc)->Move(p, Location::Host(), stream).ok() ? Sync()
                                                                     : absl::InternalError("move"); },
        [&]() -> absl::Status {
          CMA_RETURN_IF_ERROR((*alloc)->Move(p, Location::Device(device), stream));
          return Sync();
        },
        [] { return absl::OkStatus(); });
    // The data survived both directions.
    unsigned long long* bad;
    CMA_CUDA_RETURN_IF_ERROR(cudaMallocManaged(reinterpret_cast<void**>(&bad), sizeof(*bad)));
    *bad = 0;
    CMA_RETURN_IF_ERROR(LaunchCheck(p, kBytes, 6, bad, stream));
    CMA_RETURN_IF_ERROR(Sync());
    const unsigned long long mismatches = *bad;
    cudaFree(bad);
    CMA_RETURN_IF_ERROR((*alloc)->Free(p));
    if (!d2h.ok()) return d2h.status();
    if (!h2d.ok()) return h2d.status();
    if (mismatches != 0) return absl::DataLossError("data changed across moves");
    out["move_d2h_GBps"] = GBps(*d2h);
    out["move_h2d_GBps"] = GBps(*h2d);
    return absl::OkStatus();
  }

  // Device-to-host, keeping the address, by copy instead of migration:
  // (1) copy the device-resident pages to a device scratch buffer,
  // (2) discard the managed range and populate it on the host,
  // (3) copy the scratch buffer into the now host-resident pages.
  absl::Status StagedDeviceToHost(nlohmann::json& out) {
    auto alloc = Make("");
    if (!alloc.ok()) return alloc.status();
    void* p = *(*alloc)->Allocate(kBytes, device, stream);
    void* scratch = nullptr;
    CMA_CUDA_RETURN_IF_ERROR(cudaMalloc(&scratch, kBytes));
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    std::vector<double> steps(3, 0);
    auto step = [&](int i, const std::function<absl::Status()>& f) -> absl::Status {
      const auto t0 = Clock::now();
      CMA_RETURN_IF_ERROR(f());
      CMA_RETURN_IF_ERROR(Sync());
      steps[i] += std::chrono::duration<double>(Clock::now() - t0).count() / kReps;
      return absl::OkStatus();
    };
    absl::Status st;
    for (int r = 0; r < kReps && st.ok(); ++r) {
      st = LaunchFill(p, kBytes, 7, stream);
      if (st.ok()) st = Sync();
      if (st.ok()) st = step(0, [&] {
        return CudaStatus(cudaMemcpyAsync(scratch, p, kBytes, cudaMemcpyDefault, s), "cudaMemcpyAsync(D2D)");
      });
      if (st.ok()) st = step(1, [&] {
        Range range{p, kBytes};
        return backend.DiscardAndPrefetchBatch({&range, 1}, Location::Host(), stream);
      });
      if (st.ok()) st = step(2, [&] {
        return CudaStatus(cudaMemcpyAsync(p, scratch, kBytes, cudaMemcpyDefault, s), "cudaMemcpyAsync(D2H)");
      });
    }
    // Where did the pages end up, and is the data right? (sampled on the host)
    std::size_t wrong = 0;
    if (st.ok()) {
      const auto* w = static_cast<const std::uint32_t*>(p);
      for (std::size_t i = 0; i < kBytes / 4; i += 4096 + 1) wrong += w[i] != 7u + i;
    }
    auto attr = backend.GetRangeAttributes(p, kBytes);
    cudaFree(scratch);
    CMA_RETURN_IF_ERROR((*alloc)->Free(p));
    CMA_RETURN_IF_ERROR(st);
    out["move_d2h_staged"] = {
        {"GBps", GBps(steps[0] + steps[1] + steps[2])},
        {"d2d_copy_s", steps[0]},
        {"discard_and_populate_host_s", steps[1]},
        {"copy_into_host_pages_s", steps[2]},
        {"sampled_words_wrong", wrong},
        {"last_prefetch_host", attr.ok() && attr->last_prefetch_location.is_host()}};
    return absl::OkStatus();
  }

  // What users would otherwise do: raw prefetch of cudaMallocManaged memory,
  // and pinned-memory copies.
  absl::Status Baselines(nlohmann::json& out) {
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    void* m = nullptr;
    CMA_CUDA_RETURN_IF_ERROR(cudaMallocManaged(&m, kBytes));
    std::memset(m, 1, kBytes);  // resident on the host
    cudaMemLocation dev{}, host{};
    dev.type = cudaMemLocationTypeDevice;
    dev.id = device;
    host.type = cudaMemLocationTypeHost;
    auto h2d = MedianSeconds(
        [&] { return CudaStatus(cudaMemPrefetchAsync(m, kBytes, host, 0, s), "prefetch") .ok() ? Sync() : absl::InternalError("prefetch"); },
        [&]() -> absl::Status {
          CMA_CUDA_RETURN_IF_ERROR(cudaMemPrefetchAsync(m, kBytes, dev, 0, s));
          return Sync();
        },
        [] { return absl::OkStatus(); });
    auto d2h = MedianSeconds(
        [&] { return CudaStatus(cudaMemPrefetchAsync(m, kBytes, dev, 0, s), "prefetch").ok() ? Sync() : absl::InternalError("prefetch"); },
        [&]() -> absl::Status {
          CMA_CUDA_RETURN_IF_ERROR(cudaMemPrefetchAsync(m, kBytes, host, 0, s));
          return Sync();
        },
        [] { return absl::OkStatus(); });
    cudaFree(m);
    void* pinned = nullptr;
    void* d = nullptr;
    CMA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned, kBytes));
    CMA_CUDA_RETURN_IF_ERROR(cudaMalloc(&d, kBytes));
    std::memset(pinned, 2, kBytes);
    auto copy = [&](void* dst, const void* src) {
      return MedianSeconds([] { return absl::OkStatus(); },
                           [&]() -> absl::Status {
                             CMA_CUDA_RETURN_IF_ERROR(
                                 cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDefault, s));
                             return Sync();
                           },
                           [] { return absl::OkStatus(); });
    };
    auto ph2d = copy(d, pinned);
    auto pd2h = copy(pinned, d);
    cudaFree(d);
    cudaFreeHost(pinned);
    for (auto* r : {&h2d, &d2h, &ph2d, &pd2h}) {
      if (!r->ok()) return r->status();
    }
    out["raw_prefetch_h2d_GBps"] = GBps(*h2d);
    out["raw_prefetch_d2h_GBps"] = GBps(*d2h);
    out["pinned_h2d_GBps"] = GBps(*ph2d);
    out["pinned_d2h_GBps"] = GBps(*pd2h);
    return absl::OkStatus();
  }
};

}  // namespace

absl::Status CudaMigrationSuite(Backend& backend, int device, nlohmann::json& out) {
  absl::StatusOr<MemInfo> mem = backend.GetMemInfo(device);
  if (!mem.ok()) return mem.status();
  // Never oversubscribe managed memory: a shared GPU can hang.
  if (mem->free_bytes < 4 * kBytes) {
    out["migration"] = {{"skipped", "less than 8 GiB free on the device"}};
    return absl::OkStatus();
  }
  absl::StatusOr<Stream> stream = backend.CreateStream(device);
  if (!stream.ok()) return stream.status();
  Suite suite{backend, device, *stream};
  nlohmann::json m;
  m["block_bytes"] = kBytes;
  absl::Status s = suite.FreshSegment("on_alloc");
  if (s.ok()) s = suite.FreshSegment("none");
  absl::StatusOr<double> resident = s.ok() ? suite.ReusedSameDevice() : s;
  if (resident.ok()) {
    m["resident_GBps"] = *resident;
    s = suite.ReusedAfterHost("on_alloc");
  } else {
    s = resident.status();
  }
  if (s.ok()) s = suite.ReusedAfterHost("none");
  if (s.ok()) s = suite.Moves(m);
  if (s.ok()) s = suite.StagedDeviceToHost(m);
  if (s.ok()) s = suite.Baselines(m);
  (void)backend.DestroyStream(*stream);
  if (!s.ok()) return s;
  m["first_touch"] = suite.first_touch;
  out["migration"] = m;
  return absl::OkStatus();
}

}  // namespace cma
