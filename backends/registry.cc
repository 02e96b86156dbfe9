#include "backends/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/host/host_backend.h"
#ifdef CMA_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#endif
#ifdef CMA_HAVE_HIP
#include "backends/hip/hip_backend.h"
#endif

namespace cma {

std::vector<std::string> CompiledBackends() {
  std::vector<std::string> names = {"host"};
#ifdef CMA_HAVE_CUDA
  names.push_back("cuda");
#endif
#ifdef CMA_HAVE_HIP
  names.push_back("hip");
#endif
  return names;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(absl::string_view name) {
  if (name == "host") return std::unique_ptr<Backend>(new HostBackend());
#ifdef CMA_HAVE_CUDA
  if (name == "cuda" || name == "best") {
    absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend();
    if (b.ok() || name == "cuda") return b;
  }
#endif
#ifdef CMA_HAVE_HIP
  if (name == "hip" || name == "best") {
    absl::StatusOr<std::unique_ptr<Backend>> b = MakeHipBackend();
    if (b.ok() || name == "hip") return b;
  }
#endif
  if (name == "best") return std::unique_ptr<Backend>(new HostBackend());
  return absl::NotFoundError(absl::StrCat("backend '", name, "' is not compiled into this build (",
                                          absl::StrJoin(CompiledBackends(), ", "), " are)"));
}

}  // namespace cma
