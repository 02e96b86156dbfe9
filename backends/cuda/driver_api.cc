#include "backends/cuda/driver_api.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"

namespace cma {
namespace {

template <typename F>
absl::Status Resolve(const char* symbol, unsigned int version, F* out, bool required) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &fn, version, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    if (!required) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol,
                                               "): ", cudaGetErrorString(err)));
  }
  *out = reinterpret_cast<F>(fn);
  return absl::OkStatus();
}

absl::StatusOr<DriverApi> Load() {
  DriverApi d;
  absl::Status s;
  s.Update(Resolve("cuGetErrorName", 6000, &d.cuGetErrorName, true));
  s.Update(Resolve("cuGetErrorString", 6000, &d.cuGetErrorString, true));
  s.Update(Resolve("cuDeviceGet", 2000, &d.cuDeviceGet, true));
  s.Update(Resolve("cuDeviceGetAttribute", 2000, &d.cuDeviceGetAttribute, true));
  s.Update(Resolve("cuMemGetAllocationGranularity", 10020, &d.cuMemGetAllocationGranularity, true));
  s.Update(Resolve("cuMemCreate", 10020, &d.cuMemCreate, true));
  s.Update(Resolve("cuMemRelease", 10020, &d.cuMemRelease, true));
  s.Update(Resolve("cuMemAddressReserve", 10020, &d.cuMemAddressReserve, true));
  s.Update(Resolve("cuMemAddressFree", 10020, &d.cuMemAddressFree, true));
  s.Update(Resolve("cuMemMap", 10020, &d.cuMemMap, true));
  s.Update(Resolve("cuMemUnmap", 10020, &d.cuMemUnmap, true));
  s.Update(Resolve("cuMemSetAccess", 10020, &d.cuMemSetAccess, true));
  s.Update(Resolve("cuMemExportToShareableHandle", 10020, &d.cuMemExportToShareableHandle, true));
  s.Update(Resolve("cuMemImportFromShareableHandle", 10020, &d.cuMemImportFromShareableHandle,
                   true));
  s.Update(Resolve("cuMulticastCreate", 12010, &d.cuMulticastCreate, false));
  s.Update(Resolve("cuMulticastAddDevice", 12010, &d.cuMulticastAddDevice, false));
  s.Update(Resolve("cuMulticastBindMem", 12010, &d.cuMulticastBindMem, false));
  if (!s.ok()) return s;
  return d;
}

}  // namespace

absl::StatusOr<const DriverApi*> DriverApi::Get() {
  static const absl::StatusOr<DriverApi>* table = new absl::StatusOr<DriverApi>(Load());
  if (!table->ok()) return table->status();
  return &**table;
}

}  // namespace cma
