// The CUDA driver API entry points this library uses, resolved once through
// cudaGetDriverEntryPointByVersion, so that binaries need no link against
// libcuda and run with whatever driver the machine has.
//
// Thread safety: Get() is safe to call concurrently; the table is immutable
// after the first call.
#ifndef CMA_BACKENDS_CUDA_DRIVER_API_H_
#define CMA_BACKENDS_CUDA_DRIVER_API_H_

#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/status/statusor.h"

namespace cma {

struct DriverApi {
  PFN_cuGetErrorName_v6000 cuGetErrorName = nullptr;
  PFN_cuGetErrorString_v6000 cuGetErrorString = nullptr;
  PFN_cuDeviceGet_v2000 cuDeviceGet = nullptr;
  PFN_cuDeviceGetAttribute_v2000 cuDeviceGetAttribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 cuMemGetAllocationGranularity = nullptr;
  PFN_cuMemCreate_v10020 cuMemCreate = nullptr;
  PFN_cuMemRelease_v10020 cuMemRelease = nullptr;
  PFN_cuMemAddressReserve_v10020 cuMemAddressReserve = nullptr;
  PFN_cuMemAddressFree_v10020 cuMemAddressFree = nullptr;
  PFN_cuMemMap_v10020 cuMemMap = nullptr;
  PFN_cuMemUnmap_v10020 cuMemUnmap = nullptr;
  PFN_cuMemSetAccess_v10020 cuMemSetAccess = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 cuMemExportToShareableHandle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 cuMemImportFromShareableHandle = nullptr;
  // Multicast entry points may be missing on old drivers (left null).
  PFN_cuMulticastCreate_v12010 cuMulticastCreate = nullptr;
  PFN_cuMulticastAddDevice_v12010 cuMulticastAddDevice = nullptr;
  PFN_cuMulticastBindMem_v12010 cuMulticastBindMem = nullptr;

  // The process-wide table, or the error that prevented loading it.
  static absl::StatusOr<const DriverApi*> Get();
};

}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_DRIVER_API_H_
