// What users would otherwise call, measured beside the allocator: vendor
// allocation baselines per backend, and the managed-memory migration suite.
//
// Vendor code stays in backends/; this file only dispatches by backend name.
#ifndef CMA_BENCH_BASELINES_H_
#define CMA_BENCH_BASELINES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "nlohmann/json.hpp"

namespace cma {

// Extra latency columns this backend can measure (e.g. "managed_pair_ns").
std::vector<std::string> BaselineNames(Backend& backend);
// Median ns of one alloc+free pair of `bytes` through baseline `name`.
absl::StatusOr<double> MeasureBaseline(Backend& backend, const std::string& name, int device,
                                       std::size_t bytes, int reps);
// Fills out["migration"] where the backend has real migration (CUDA);
// elsewhere records why it was skipped.
absl::Status MigrationSuite(Backend& backend, int device, nlohmann::json& out);
// Fills out["symmetric"]: a group of every visible device in this process;
// cached and first allocation times (per backend call), and on CUDA the
// peer-write bandwidth through symmetric pointers against cudaMemcpyPeer.
absl::Status SymmetricSuite(Backend& backend, nlohmann::json& out);

}  // namespace cma

#endif  // CMA_BENCH_BASELINES_H_
