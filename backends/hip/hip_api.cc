#include "backends/hip/hip_api.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace cma {
namespace {

absl::StatusOr<HipApi> Load() {
  void* lib = nullptr;
  std::string tried;
  for (const char* name : {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
  }
  if (lib == nullptr) {
    return absl::UnavailableError(absl::StrCat("the HIP runtime is not installed (", tried, ")"));
  }
  HipApi api;
#define CMA_HIP_LOAD(f)                                                             \
  api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f));                        \
  if (api.f == nullptr) {                                                           \
    return absl::UnavailableError(absl::StrCat("libamdhip64 lacks " #f ": ", dlerror())); \
  }
  CMA_HIP_FUNCTIONS(CMA_HIP_LOAD)
  CMA_HIP_LOAD(hipMallocManaged)
#undef CMA_HIP_LOAD
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

absl::StatusOr<const HipApi*> HipApi::Get() {
  static const absl::StatusOr<HipApi>* table = new absl::StatusOr<HipApi>(Load());
  if (!table->ok()) return table->status();
  return &**table;
}

}  // namespace cma
