#include "bench/baselines.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#ifdef CMA_HAVE_CUDA
#include "backends/cuda/cuda_bench.h"
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
  out["migration"] = {{"skipped", absl::StrCat("the ", backend.name(),
                                               " backend has no real page migration to measure")}};
  return absl::OkStatus();
}

}  // namespace cma
