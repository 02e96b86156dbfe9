#include "bench/baselines.h"

#include <cstring>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/symmetric_heap.h"
#ifdef CMA_HAVE_CUDA
#include "bench/cuda/cuda_bench.h"
#endif

namespace cma {

std::vector<std::string> BaselineNames(Backend& backend) {
#ifdef CMA_HAVE_CUDA
  if (std::strcmp(backend.name(), "cuda") == 0) return CudaBaselineNames();
#endif
  return {};
}

absl::StatusOr<double> MeasureBaseline(Backend& backend, const std::string& name, int device,
                                       std::size_t bytes, int reps) {
#ifdef CMA_HAVE_CUDA
  if (std::strcmp(backend.name(), "cuda") == 0) {
    return MeasureCudaBaseline(name, device, bytes, reps);
  }
#endif
  return absl::NotFoundError(absl::StrCat("no baseline '", name, "' on backend ", backend.name()));
}

absl::Status MigrationSuite(Backend& backend, int device, nlohmann::json& out) {
#ifdef CMA_HAVE_CUDA
  if (std::strcmp(backend.name(), "cuda") == 0) return CudaMigrationSuite(backend, device, out);
#endif
  // The suite touches pages with CUDA kernels; the host backend migrates
  // nothing and the HIP backend has no kernels here (no hipcc build).
  out["migration"] = {{"skipped", absl::StrCat("the migration suite runs CUDA kernels; the ",
                                               backend.name(), " backend has none here")}};
  return absl::OkStatus();
}

absl::Status SymmetricSuite(Backend& backend, nlohmann::json& out) {
  absl::StatusOr<int> n = backend.DeviceCount();
  if (!n.ok()) return n.status();
  SymmetricGroup group;
  group.world_size = *n;
  for (int d = 0; d < *n; ++d) {
    group.local_ranks.push_back(d);
    group.local_devices.push_back(d);
  }
  auto heap = SymmetricHeap::Create(backend, group, MakeSingleProcessExchange());
  if (!heap.ok()) {
    out["symmetric"] = {{"skipped", std::string(heap.status().message())}};
    return absl::OkStatus();
  }
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  absl::StatusOr<SymmetricHandle> first = (*heap)->Allocate(kBytes);
  const double first_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  if (!first.ok()) return first.status();
  nlohmann::json breakdown = nlohmann::json::object();
  for (const auto& [step, seconds] : (*heap)->GetStats().last_miss_seconds) {
    breakdown[step] = seconds * 1e6;
  }
  nlohmann::json sym = {{"devices", *n},
                        {"bytes_per_member", kBytes},
                        {"first_alloc_us", first_us},
                        {"first_alloc_breakdown_us", breakdown}};
#ifdef CMA_HAVE_CUDA
  if (std::strcmp(backend.name(), "cuda") == 0 && *n >= 2) {
    absl::StatusOr<PeerBandwidth> bw = MeasurePeerBandwidth((*first)->peers[1], kBytes, 0, 1);
    if (!bw.ok()) return bw.status();
    sym["peer_write_GBps"] = bw->peer_write_GBps;
    sym["memcpy_peer_GBps"] = bw->memcpy_peer_GBps;
    sym["peer_write_over_memcpy"] = bw->peer_write_GBps / bw->memcpy_peer_GBps;
  }
#endif
  if (absl::Status s = (*heap)->Free(*first); !s.ok()) return s;
  // Steady state: the freed segment serves the next collective allocation.
  std::vector<double> samples;
  for (int rep = 0; rep < 15; ++rep) {
    const auto r0 = Clock::now();
    for (int i = 0; i < 1000; ++i) {
      absl::StatusOr<SymmetricHandle> a = (*heap)->Allocate(kBytes);
      if (!a.ok()) return a.status();
      if (absl::Status s = (*heap)->Free(*a); !s.ok()) return s;
    }
    samples.push_back(std::chrono::duration<double, std::nano>(Clock::now() - r0).count() / 1000);
  }
  std::sort(samples.begin(), samples.end());
  sym["cached_alloc_ns"] = samples[samples.size() / 2];
  sym["cache_hits"] = (*heap)->GetStats().cache_hits;
  out["symmetric"] = sym;
  return (*heap)->EmptyCache();
}

}  // namespace cma
