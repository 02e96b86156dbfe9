// Replays an allocation trace through a CachingManagedAllocator and reports
// how much memory it held against what the trace asked for.
//
// Frees of addresses the trace never allocated (made before recording began)
// are skipped. Each distinct trace stream id other than 0 gets its own backend
// stream on `device`; streams are destroyed before returning.
//
// Two passes over the trace in one allocator: the first measures the peak
// (populated bytes from the allocator's accounting and, with
// `sample_device_memory`, the lowest free memory the backend reports, after
// each allocation's stream is synchronised so its placement has happened);
// the second, with the cache warm, measures steady-state time per operation
// and backend calls per operation (counted by a wrapper the allocator was
// created on, when `calls` is given).
#ifndef CMA_BENCH_REPLAY_H_
#define CMA_BENCH_REPLAY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/caching_managed_allocator.h"
#include "bench/trace.h"

namespace cma {

struct ReplayOptions {
  bool sample_device_memory = false;
  // Every allocation inside a private pool (PyTorch's use_mem_pool: a
  // context that is no capture), made before and released after the passes.
  bool in_pool = false;
  // Backend calls made so far (e.g. FaultInjectingBackend::Calls); optional.
  std::function<std::int64_t()> calls;
};

struct ReplayResult {
  std::string trace;
  std::int64_t ops = 0;  // per pass
  std::int64_t skipped_frees = 0;
  std::int64_t peak_requested = 0;
  std::int64_t peak_reserved = 0;  // the allocator's own count (arena: populated)
  double ratio = 0;                // peak_reserved / peak_requested
  // (free at start - lowest free) from the backend, when sampled; else 0.
  std::int64_t peak_device_used = 0;
  double device_ratio = 0;
  std::int64_t backend_allocs = 0;  // first pass
  std::int64_t ooms = 0;
  double ns_per_op = 0;                   // first pass
  double steady_ns_per_op = 0;            // second pass
  double steady_backend_calls_per_op = -1;  // second pass; -1 when not counted
  std::int64_t steady_pages_populated = 0;  // second pass (arena mode)
  std::int64_t steady_pages_discarded = 0;
};

absl::StatusOr<ReplayResult> Replay(CachingManagedAllocator& allocator, int device,
                                    const std::vector<TraceOp>& ops, const std::string& name,
                                    const ReplayOptions& options = {});

}  // namespace cma

#endif  // CMA_BENCH_REPLAY_H_
