// CudaBackend's virtual memory management (physical handles, reservations,
// mappings, access, export and import of shareable handles) and multicast,
// refused whenever the environment disables it.
#include "backends/cuda/cuda_backend_internal.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"

namespace cma {
namespace cuda_internal {

namespace {

bool MulticastDisabledByEnvironment() {
  auto is = [](const char* name, const char* value) {
    const char* v = std::getenv(name);
    return v != nullptr && std::strcmp(v, value) == 0;
  };
  return is("CMA_DISABLE_MULTICAST", "1") || is("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1") ||
         is("NCCL_NVLS_ENABLE", "0");
}

CUmemAllocationHandleType ToCu(HandleType t) {
  return t == HandleType::kFabric ? CU_MEM_HANDLE_TYPE_FABRIC
                                  : CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

}  // namespace

// ---- VMM ----
CUmemAllocationProp CudaBackend::Prop(int device, HandleType type) const {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = ToCu(type);
  return p;
}

absl::StatusOr<std::size_t> CudaBackend::VmmGranularity(int device) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  CUmemAllocationProp p = Prop(device, HandleType::kPosixFd);
  std::size_t g = 0;
  CMA_CU_RETURN_IF_ERROR(
      cu_->cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  return g;
}

absl::StatusOr<PhysicalHandle> CudaBackend::VmmCreate(int device, std::size_t bytes,
                                                      HandleType exportable) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  DeviceGuard g(device);
  CMA_RETURN_IF_ERROR(g.status());
  CUmemAllocationProp p = Prop(device, exportable);
  CUmemGenericAllocationHandle h;
  CMA_CU_RETURN_IF_ERROR(cu_->cuMemCreate(&h, bytes, &p, 0));
  return static_cast<PhysicalHandle>(h);
}

absl::Status CudaBackend::VmmRelease(PhysicalHandle handle) {
  CMA_CU_RETURN_IF_ERROR(cu_->cuMemRelease(handle));
  return absl::OkStatus();
}

absl::StatusOr<void*> CudaBackend::VmmReserve(std::size_t bytes, std::size_t alignment) {
  CUdeviceptr p = 0;
  CMA_CU_RETURN_IF_ERROR(cu_->cuMemAddressReserve(&p, bytes, alignment, 0, 0));
  return reinterpret_cast<void*>(p);
}

absl::Status CudaBackend::VmmFreeAddress(void* address, std::size_t bytes) {
  CMA_CU_RETURN_IF_ERROR(cu_->cuMemAddressFree(reinterpret_cast<CUdeviceptr>(address), bytes));
  return absl::OkStatus();
}

absl::Status CudaBackend::VmmMap(void* address, std::size_t bytes, PhysicalHandle handle) {
  CMA_CU_RETURN_IF_ERROR(
      cu_->cuMemMap(reinterpret_cast<CUdeviceptr>(address), bytes, 0, handle, 0));
  return absl::OkStatus();
}

absl::Status CudaBackend::VmmUnmap(void* address, std::size_t bytes) {
  CMA_CU_RETURN_IF_ERROR(cu_->cuMemUnmap(reinterpret_cast<CUdeviceptr>(address), bytes));
  return absl::OkStatus();
}

absl::Status CudaBackend::VmmSetAccess(void* address, std::size_t bytes,
                                       absl::Span<const int> devices) {
  std::vector<CUmemAccessDesc> desc(devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i) {
    CMA_RETURN_IF_ERROR(CheckDevice(devices[i]));
    desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[i].location.id = devices[i];
    desc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  CMA_CU_RETURN_IF_ERROR(cu_->cuMemSetAccess(reinterpret_cast<CUdeviceptr>(address), bytes,
                                             desc.data(), desc.size()));
  return absl::OkStatus();
}

absl::StatusOr<ShareableHandle> CudaBackend::VmmExport(PhysicalHandle handle, HandleType type) {
  ShareableHandle out;
  out.type = type;
  if (type == HandleType::kFabric) {
    CUmemFabricHandle fh;
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemExportToShareableHandle(&fh, handle, ToCu(type), 0));
    static_assert(sizeof(fh.data) == sizeof(out.fabric), "fabric handle size");
    std::memcpy(out.fabric, fh.data, sizeof(out.fabric));
  } else {
    int fd = -1;
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemExportToShareableHandle(&fd, handle, ToCu(type), 0));
    out.fd = fd;
  }
  return out;
}

absl::StatusOr<PhysicalHandle> CudaBackend::VmmImport(const ShareableHandle& shared) {
  CUmemGenericAllocationHandle h;
  if (shared.type == HandleType::kFabric) {
    CUmemFabricHandle fh;
    std::memcpy(fh.data, shared.fabric, sizeof(fh.data));
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemImportFromShareableHandle(&h, &fh, ToCu(shared.type)));
  } else {
    void* os_handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(shared.fd));
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemImportFromShareableHandle(&h, os_handle, ToCu(shared.type)));
  }
  return static_cast<PhysicalHandle>(h);
}

// ---- multicast: guarded; never exercised on shared machines ----
absl::Status CudaBackend::MulticastAllowed() const {
  if (MulticastDisabledByEnvironment()) {
    return absl::FailedPreconditionError(
        "multicast is disabled by the environment (CMA_DISABLE_MULTICAST, "
        "TORCH_SYMM_MEM_DISABLE_MULTICAST or NCCL_NVLS_ENABLE)");
  }
  if (cu_->cuMulticastCreate == nullptr) {
    return absl::UnimplementedError("this CUDA driver has no multicast entry points");
  }
  return absl::OkStatus();
}

absl::StatusOr<MulticastHandle> CudaBackend::MulticastCreate(absl::Span<const int> devices,
                                                             std::size_t bytes) {
  CMA_RETURN_IF_ERROR(MulticastAllowed());
  for (int d : devices) {
    CMA_RETURN_IF_ERROR(CheckDevice(d));
    absl::StatusOr<DeviceFacts> facts = GetDeviceFacts(d);
    if (!facts.ok()) return facts.status();
    if (!facts->multicast_supported) {
      return absl::UnimplementedError(
          absl::StrFormat("device %d reports no multicast support", d));
    }
  }
  CUmulticastObjectProp p{};
  p.numDevices = static_cast<unsigned int>(devices.size());
  p.size = bytes;
  p.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h;
  CMA_CU_RETURN_IF_ERROR(cu_->cuMulticastCreate(&h, &p));
  return static_cast<MulticastHandle>(h);
}

absl::Status CudaBackend::MulticastAddDevice(MulticastHandle mc, int device) {
  CMA_RETURN_IF_ERROR(MulticastAllowed());
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  CUdevice dev;
  CMA_CU_RETURN_IF_ERROR(cu_->cuDeviceGet(&dev, device));
  CMA_CU_RETURN_IF_ERROR(cu_->cuMulticastAddDevice(mc, dev));
  return absl::OkStatus();
}

absl::Status CudaBackend::MulticastBindMemory(MulticastHandle mc, std::size_t mc_offset, PhysicalHandle mem,
                                              std::size_t mem_offset, std::size_t bytes) {
  CMA_RETURN_IF_ERROR(MulticastAllowed());
  CMA_CU_RETURN_IF_ERROR(cu_->cuMulticastBindMem(mc, mc_offset, mem, mem_offset, bytes, 0));
  return absl::OkStatus();
}

absl::Status CudaBackend::MulticastRelease(MulticastHandle mc) {
  CMA_CU_RETURN_IF_ERROR(cu_->cuMemRelease(mc));
  return absl::OkStatus();
}

}  // namespace cuda_internal

}  // namespace cma
