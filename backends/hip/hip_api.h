// The HIP runtime entry points this library uses, loaded with dlopen at run
// time so that one binary runs on machines with or without ROCm. Every
// pointer's type comes from HIP's own headers (decltype), so signatures are
// checked at compile time.
//
// Thread safety: Get() may be called concurrently; the table is immutable
// once loaded.
#ifndef CMA_BACKENDS_HIP_HIP_API_H_
#define CMA_BACKENDS_HIP_HIP_API_H_

#include <hip/hip_runtime_api.h>

#include <string>

#include "absl/status/statusor.h"

namespace cma {

#define CMA_HIP_FUNCTIONS(X)                                                             \
  X(hipGetDeviceCount) X(hipGetDevice) X(hipSetDevice) X(hipGetErrorName)                \
  X(hipGetErrorString) X(hipGetDeviceProperties) X(hipDeviceGetAttribute)               \
  X(hipMemGetInfo) X(hipFree) X(hipMemAdvise) X(hipMemPrefetchAsync) \
  X(hipMemRangeGetAttribute) X(hipStreamCreateWithFlags) X(hipStreamDestroy)            \
  X(hipStreamSynchronize) X(hipStreamQuery) X(hipStreamGetFlags) X(hipEventCreateWithFlags)               \
  X(hipEventDestroy) X(hipEventRecord) X(hipEventQuery) X(hipEventSynchronize)          \
  X(hipStreamWaitEvent) X(hipMemGetAllocationGranularity) X(hipMemCreate)               \
  X(hipMemRelease) X(hipMemAddressReserve) X(hipMemAddressFree) X(hipMemMap)            \
  X(hipMemUnmap) X(hipMemSetAccess) X(hipMemExportToShareableHandle)                    \
  X(hipMemImportFromShareableHandle)

struct HipApi {
#define CMA_HIP_MEMBER(f) decltype(&::f) f = nullptr;
  CMA_HIP_FUNCTIONS(CMA_HIP_MEMBER)
#undef CMA_HIP_MEMBER
  // Overloaded in C++ (a template for typed pointers): named by its C form.
  hipError_t (*hipMallocManaged)(void**, size_t, unsigned int) = nullptr;
  // Optional (nullptr when the library lacks them).
  decltype(&::hipRuntimeGetVersion) hipRuntimeGetVersion = nullptr;
  decltype(&::hipLaunchHostFunc) hipLaunchHostFunc = nullptr;
  // The file the runtime was loaded from.
  std::string library;

  // The process-wide table; kUnavailable naming the library or symbol that
  // could not be loaded. CMA_HIP_LIBRARY, when set, names the library to
  // load (a file that does not exist is an error, not a fallback); otherwise
  // libamdhip64.so from the loader's path.
  static absl::StatusOr<const HipApi*> Get();
};

}  // namespace cma

#endif  // CMA_BACKENDS_HIP_HIP_API_H_
