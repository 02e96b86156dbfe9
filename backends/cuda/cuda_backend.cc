// CudaBackend: its lifetime, device facts and memory information, and the
// forwarders to pinned host memory (cuda_pinned.h), NVSHMEM (cuda_shmem.h)
// and NCCL windows (nccl_api.h); MakeCudaBackend. The class and the helpers
// its parts share: cuda_backend_internal.h.
#include "backends/cuda/cuda_backend.h"

#include "backends/cuda/cuda_backend_internal.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/cuda/nccl_api.h"

namespace cma {
namespace cuda_internal {

CudaBackend::~CudaBackend() {
  MutexLock l(&side_mu_);
  for (auto& [device, side] : side_) {
    if (side.stream != nullptr) cudaStreamDestroy(side.stream);
    if (side.before != nullptr) cudaEventDestroy(side.before);
    if (side.after != nullptr) cudaEventDestroy(side.after);
  }
}

absl::Status CudaBackend::CheckDevice(int device) const {
  if (device < 0 || device >= device_count_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid device %d: %d CUDA devices are visible", device, device_count_));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceFacts> CudaBackend::GetDeviceFacts(int device) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  cudaDeviceProp prop;
  CMA_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  DeviceFacts f;
  f.name = prop.name;
  f.total_bytes = prop.totalGlobalMem;
  int v = 0;
  CMA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&v, cudaDevAttrConcurrentManagedAccess, device));
  f.concurrent_managed_access = v != 0;
  // On CUDA, managed memory migrates on fault whenever concurrent access is
  // supported (Pascal and newer on Linux).
  f.page_fault_migration = v != 0;
  CMA_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&v, cudaDevAttrPageableMemoryAccess, device));
  f.pageable_memory_access = v != 0;
  CUdevice dev;
  CMA_CU_RETURN_IF_ERROR(cu_->cuDeviceGet(&dev, device));
  auto attr = [&](CUdevice_attribute a) {
    int x = 0;
    return cu_->cuDeviceGetAttribute(&x, a, dev) == CUDA_SUCCESS && x != 0;
  };
  f.vmm_supported = attr(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
  f.posix_fd_handles = attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
  f.fabric_handles = attr(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
  f.multicast_supported = attr(CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED);  // query only
  if (f.vmm_supported) {
    absl::StatusOr<std::size_t> g = VmmGranularity(device);
    if (g.ok()) f.vmm_granularity = *g;
  }
  int runtime = 0, driver = 0;
  (void)cudaRuntimeGetVersion(&runtime);  // facts for reports: a failure leaves 0
  (void)cudaDriverGetVersion(&driver);
  f.runtime = absl::StrCat("CUDA runtime ", runtime, ", driver ", driver);
  return f;
}

absl::StatusOr<MemInfo> CudaBackend::GetMemInfo(int device) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  DeviceGuard g(device);
  CMA_RETURN_IF_ERROR(g.status());
  MemInfo m;
  // A device's budget is planned at its first allocation, which may be made
  // while a stream captures (a graph's first use of the device).
  RelaxedCaptureMode relaxed;
  CMA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

// ---- pinned host memory (backends/cuda/cuda_pinned.h) and copies (sleep staging) ----
absl::StatusOr<void*> CudaBackend::AllocatePinnedHost(std::size_t bytes) {
  return pinned_.Allocate(bytes);
}

absl::Status CudaBackend::FreePinnedHost(void* ptr) { return pinned_.Free(ptr); }

absl::Status CudaBackend::PeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) {
  return CudaPeerCopy(dst, src, bytes, stream);
}

absl::StatusOr<Backend::ShmemState> CudaBackend::ShmemQueryState() { return shmem_.QueryState(); }

absl::StatusOr<std::string> CudaBackend::ShmemUniqueId() { return shmem_.UniqueId(); }

absl::Status CudaBackend::ShmemInit(const std::string& id, int pe, int n_pes, int device) {
  CMA_RETURN_IF_ERROR(CheckDevice(device));
  return shmem_.Init(id, pe, n_pes, device);
}

absl::StatusOr<void*> CudaBackend::ShmemMalloc(std::size_t bytes) { return shmem_.Malloc(bytes); }

absl::Status CudaBackend::ShmemFree(void* ptr) { return shmem_.Free(ptr); }

absl::StatusOr<void*> CudaBackend::ShmemPeerPointer(void* ptr, int pe) {
  return shmem_.PeerPointer(ptr, pe);
}

absl::Status CudaBackend::ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                                   Stream stream) {
  return shmem_.Put(dst, src, bytes, pe, stream);
}

absl::Status CudaBackend::ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                                   Stream stream) {
  return shmem_.Get(dst, src, bytes, pe, stream);
}

absl::Status CudaBackend::ShmemQuiet(Stream stream) { return shmem_.Quiet(stream); }

absl::StatusOr<CommFacts> CudaBackend::GetCommFacts(CommHandle comm) {
  return NcclCommFacts(comm);
}

absl::StatusOr<CommWindow> CudaBackend::RegisterCommWindow(CommHandle comm, void* ptr,
                                                           std::size_t bytes) {
  return NcclRegisterWindow(comm, ptr, bytes);
}

absl::Status CudaBackend::DeregisterCommWindow(CommHandle comm, CommWindow window) {
  return NcclDeregisterWindow(comm, window);
}

}  // namespace cuda_internal

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no CUDA device is visible (cudaGetDeviceCount: ",
        err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")"));
  }
  absl::StatusOr<const DriverApi*> cu = DriverApi::Get();
  if (!cu.ok()) return cu.status();
  return std::unique_ptr<Backend>(new cuda_internal::CudaBackend(count, *cu));
}

}  // namespace cma
