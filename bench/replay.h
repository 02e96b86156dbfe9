// Replays an allocation trace through a CachingManagedAllocator and reports
// how much memory it reserved against what the trace asked for.
//
// Frees of addresses the trace never allocated (made before recording began)
// are skipped. Each distinct trace stream id other than 0 gets its own backend
// stream on `device`; streams are destroyed before returning.
#ifndef CMA_BENCH_REPLAY_H_
#define CMA_BENCH_REPLAY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "allocator/caching_managed_allocator.h"
#include "bench/trace.h"

namespace cma {

struct ReplayResult {
  std::string trace;
  std::int64_t ops = 0;
  std::int64_t skipped_frees = 0;
  std::int64_t peak_requested = 0;
  std::int64_t peak_reserved = 0;
  double ratio = 0;  // peak_reserved / peak_requested
  std::int64_t backend_allocs = 0;
  std::int64_t ooms = 0;
  double ns_per_op = 0;
};

absl::StatusOr<ReplayResult> Replay(CachingManagedAllocator& allocator, int device,
                                    const std::vector<TraceOp>& ops, const std::string& name);

}  // namespace cma

#endif  // CMA_BENCH_REPLAY_H_
