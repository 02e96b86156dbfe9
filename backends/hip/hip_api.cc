#include "backends/hip/hip_api.h"

#include <dlfcn.h>
#include <link.h>
#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace cma {
namespace {

absl::StatusOr<HipApi> Load() {
  void* lib = nullptr;
  std::string tried;
  const char* chosen = std::getenv("CMA_HIP_LIBRARY");
  if (chosen != nullptr && chosen[0] != '\0') {
    struct stat st;
    if (stat(chosen, &st) != 0) {
      return absl::UnavailableError(
          absl::StrCat("CMA_HIP_LIBRARY names ", chosen, ", which does not exist"));
    }
    lib = dlopen(chosen, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("CMA_HIP_LIBRARY=", chosen, " cannot be loaded: ", dlerror()));
    }
  } else {
    for (const char* name : {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
    }
  }
  if (lib == nullptr) {
    return absl::UnavailableError(absl::StrCat("the HIP runtime is not installed (", tried, ")"));
  }
  HipApi api;
  link_map* map = nullptr;
  if (dlinfo(lib, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) {
    api.library = map->l_name;
  }
#define CMA_HIP_LOAD(f)                                                             \
  api.f = reinterpret_cast<decltype(api.f)>(dlsym(lib, #f));                        \
  if (api.f == nullptr) {                                                           \
    return absl::UnavailableError(absl::StrCat("libamdhip64 lacks " #f ": ", dlerror())); \
  }
  CMA_HIP_FUNCTIONS(CMA_HIP_LOAD)
  CMA_HIP_LOAD(hipMallocManaged)
#undef CMA_HIP_LOAD
  api.hipRuntimeGetVersion =
      reinterpret_cast<decltype(api.hipRuntimeGetVersion)>(dlsym(lib, "hipRuntimeGetVersion"));
  api.hipLaunchHostFunc =
      reinterpret_cast<decltype(api.hipLaunchHostFunc)>(dlsym(lib, "hipLaunchHostFunc"));
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

absl::StatusOr<const HipApi*> HipApi::Get() {
  static const absl::StatusOr<HipApi>* table = new absl::StatusOr<HipApi>(Load());
  if (!table->ok()) return table->status();
  return &**table;
}

}  // namespace cma
