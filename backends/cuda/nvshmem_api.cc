#include "backends/cuda/nvshmem_api.h"

#include <dlfcn.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace cma {
namespace {

constexpr char kSoname[] = "libnvshmem_host.so.3";

template <typename F>
absl::Status Resolve(void* lib, const std::string& path, const char* symbol, F* out) {
  void* fn = dlsym(lib, symbol);
  if (fn == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "NVSHMEM: ", path, " has no ", symbol,
        " (the NVSHMEM provider needs NVSHMEM 3.x's host library, as in nvidia-nvshmem-cu13)"));
  }
  *out = reinterpret_cast<F>(fn);
  return absl::OkStatus();
}

absl::StatusOr<NvshmemApi> Load() {
  NvshmemApi api;
  const char* env = std::getenv("CMA_NVSHMEM_LIBRARY");
  api.path = env != nullptr && *env != '\0' ? env : kSoname;
  // RTLD_LOCAL: nothing of NVSHMEM's leaks into the global namespace; a
  // copy the process loaded already (torch's) is the one returned.
  void* lib = dlopen(api.path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat(
        "NVSHMEM: cannot load ", api.path, " (", why != nullptr ? why : "no reason given",
        "); install NVSHMEM 3 (pip install nvidia-nvshmem-cu13) and put its lib directory on "
        "LD_LIBRARY_PATH, or set CMA_NVSHMEM_LIBRARY to the library's path"));
  }
  absl::Status s;
  s.Update(Resolve(lib, api.path, "nvshmemx_get_uniqueid", &api.get_uniqueid));
  s.Update(Resolve(lib, api.path, "nvshmemx_set_attr_uniqueid_args", &api.set_attr_uniqueid_args));
  s.Update(Resolve(lib, api.path, "nvshmemx_hostlib_init_attr", &api.hostlib_init_attr));
  s.Update(Resolve(lib, api.path, "nvshmemx_init_status", &api.init_status));
  s.Update(Resolve(lib, api.path, "nvshmem_my_pe", &api.my_pe));
  s.Update(Resolve(lib, api.path, "nvshmem_n_pes", &api.n_pes));
  s.Update(Resolve(lib, api.path, "nvshmem_malloc", &api.malloc));
  s.Update(Resolve(lib, api.path, "nvshmem_free", &api.free));
  s.Update(Resolve(lib, api.path, "nvshmem_ptr", &api.ptr));
  s.Update(Resolve(lib, api.path, "nvshmemx_putmem_on_stream", &api.putmem_on_stream));
  s.Update(Resolve(lib, api.path, "nvshmemx_getmem_on_stream", &api.getmem_on_stream));
  s.Update(Resolve(lib, api.path, "nvshmemx_quiet_on_stream", &api.quiet_on_stream));
  if (!s.ok()) {
    dlclose(lib);
    return s;
  }
  // Never closed: NVSHMEM keeps threads and mappings for the process's life.
  return api;
}

}  // namespace

absl::StatusOr<const NvshmemApi*> NvshmemApi::Get() {
  static const absl::StatusOr<NvshmemApi>* table = new absl::StatusOr<NvshmemApi>(Load());
  if (!table->ok()) return table->status();
  return &**table;
}

}  // namespace cma
