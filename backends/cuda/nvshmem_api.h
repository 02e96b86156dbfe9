// NVSHMEM's host library, loaded at run time (dlopen), never linked or
// vendored: the few entry points the symmetric heap's NVSHMEM provider uses,
// and the types they take, declared here from NVSHMEM 3.4's headers (each
// struct's size is checked against the header's own static_assert).
//
// The library is $CMA_NVSHMEM_LIBRARY when set, else the soname
// libnvshmem_host.so.3 (found as the dynamic loader finds it: the pip
// package nvidia-nvshmem-cu13 puts it where torch's run path looks, and
// LD_LIBRARY_PATH reaches any other). In a process that has loaded it
// already (torch), dlopen returns that copy, and its NVSHMEM state is
// shared.
//
// Thread safety: Get() is safe to call concurrently; the table is immutable
// after the first call. Errors: kUnavailable naming the library and
// dlerror() when it cannot be loaded; kUnimplemented naming the first
// missing entry point of an older or foreign library.
#ifndef CMA_BACKENDS_CUDA_NVSHMEM_API_H_
#define CMA_BACKENDS_CUDA_NVSHMEM_API_H_

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"

namespace cma {
namespace nvshmem_abi {

// include/bootstrap_device_host/nvshmem_uniqueid.h:27-30 (NVSHMEM 3.4.5):
// typedef struct { int version; char internal[UNIQUEID_PADDING /* 124 */]; }
// nvshmemx_uniqueid_v1; static_assert(sizeof == 128) at line 30. The
// version NVSHMEMX_UNIQUEID_INITIALIZER sets (line 11): (1 << 16) + sizeof.
struct UniqueId {
  int version;
  char internal[124];
};
static_assert(sizeof(UniqueId) == 128, "nvshmemx_uniqueid_v1 is 128 bytes");

// nvshmem_uniqueid.h:33-39: { int version; nvshmemx_uniqueid_v1 *id; int
// myrank; int nranks; } nvshmemx_uniqueid_args_v1, 24 bytes.
struct UniqueIdArgs {
  int version;
  UniqueId* id;
  int myrank;
  int nranks;
};
static_assert(sizeof(UniqueIdArgs) == 24, "nvshmemx_uniqueid_args_v1 is 24 bytes");

// include/device_host/nvshmem_types.h:228-233: { int version;
// nvshmemx_uniqueid_args_t uid_args; char content[INIT_ARGS_PADDING /* 96,
// line 4 */]; } nvshmemx_init_args_v1, 128 bytes.
struct InitArgs {
  int version;
  UniqueIdArgs uid_args;
  char content[96];
};
static_assert(sizeof(InitArgs) == 128, "nvshmemx_init_args_v1 is 128 bytes");

// nvshmem_types.h:237-242: { int version; void *mpi_comm;
// nvshmemx_init_args_t args; } nvshmemx_init_attr_v1, 144 bytes. Versions
// as nvshmemx_init_init_attr_ver_only (lines 37-42) sets them, which
// nvshmemx_init_attr (an inline function of nvshmemx_api.h, so not in the
// library) does before it initialises; nvshmemx_hostlib_init_attr, which
// we call, expects them set.
struct InitAttr {
  int version;
  void* mpi_comm;
  InitArgs args;
};
static_assert(sizeof(InitAttr) == 144, "nvshmemx_init_attr_v1 is 144 bytes");

constexpr int Version(std::size_t bytes) { return (1 << 16) + static_cast<int>(bytes); }

// include/host/nvshmemx_api.h:42: NVSHMEMX_INIT_WITH_UNIQUEID = 1 << 3.
constexpr unsigned int kInitWithUniqueId = 1u << 3;
// include/device_host_transport/nvshmem_constants.h:77-79:
// NVSHMEM_STATUS_NOT_INITIALIZED = 0, IS_BOOTSTRAPPED, IS_INITIALIZED.
constexpr int kStatusIsInitialized = 2;

}  // namespace nvshmem_abi

struct NvshmemApi {
  // nvshmemx_api.h:71, 67-69, 52-53; nvshmem_api.h:49, 74-75, 82, 86, 88;
  // nvshmemx_api.h:113 (put), 219 (get), 249 (quiet).
  int (*get_uniqueid)(nvshmem_abi::UniqueId*) = nullptr;
  int (*set_attr_uniqueid_args)(int, int, const nvshmem_abi::UniqueId*,
                                nvshmem_abi::InitAttr*) = nullptr;
  int (*hostlib_init_attr)(unsigned int, nvshmem_abi::InitAttr*) = nullptr;
  int (*init_status)() = nullptr;
  int (*my_pe)() = nullptr;
  int (*n_pes)() = nullptr;
  void* (*malloc)(size_t) = nullptr;
  void (*free)(void*) = nullptr;
  void* (*ptr)(const void*, int) = nullptr;
  void (*putmem_on_stream)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  void (*getmem_on_stream)(void*, const void*, size_t, int, cudaStream_t) = nullptr;
  void (*quiet_on_stream)(cudaStream_t) = nullptr;
  std::string path;  // what was loaded

  // The process-wide table, or why it could not be loaded.
  static absl::StatusOr<const NvshmemApi*> Get();
};

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_NVSHMEM_API_H_
