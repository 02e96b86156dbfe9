// The CUDA half of hip_on_cuda: each bridge call on the CUDA runtime (driver
// API for VMM, resolved through cudaGetDriverEntryPointByVersion as the CUDA
// backend does), CUDA's errors folded into bridge::Err.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

#include "tests/gpu/hip_on_cuda/bridge.h"

namespace hip_on_cuda {
namespace {

thread_local char last_error[256];

Err Fold(cudaError_t e) {
  if (e == cudaSuccess) return Err::kSuccess;
  std::snprintf(last_error, sizeof(last_error), "%s: %s", cudaGetErrorName(e),
                cudaGetErrorString(e));
  switch (e) {
    case cudaErrorInvalidValue: return Err::kInvalidValue;
    case cudaErrorMemoryAllocation: return Err::kOutOfMemory;
    case cudaErrorInitializationError: return Err::kNotInitialized;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver: return Err::kNoDevice;
    case cudaErrorInvalidDevice: return Err::kInvalidDevice;
    case cudaErrorInvalidResourceHandle: return Err::kInvalidHandle;
    case cudaErrorInvalidDevicePointer: return Err::kInvalidDevicePointer;
    case cudaErrorNotReady: return Err::kNotReady;
    case cudaErrorNotSupported: return Err::kNotSupported;
    case cudaErrorIllegalAddress: return Err::kIllegalAddress;
    case cudaErrorLaunchFailure: return Err::kLaunchFailure;
    case cudaErrorContextIsDestroyed: return Err::kContextIsDestroyed;
    default: return Err::kUnknown;
  }
}

Err Fold(CUresult r) {
  if (r == CUDA_SUCCESS) return Err::kSuccess;
  std::snprintf(last_error, sizeof(last_error), "CUresult %d", static_cast<int>(r));
  switch (r) {
    case CUDA_ERROR_INVALID_VALUE: return Err::kInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return Err::kOutOfMemory;
    case CUDA_ERROR_NOT_INITIALIZED: return Err::kNotInitialized;
    case CUDA_ERROR_NO_DEVICE: return Err::kNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return Err::kInvalidDevice;
    case CUDA_ERROR_INVALID_HANDLE: return Err::kInvalidHandle;
    case CUDA_ERROR_NOT_SUPPORTED: return Err::kNotSupported;
    default: return Err::kUnknown;
  }
}

cudaMemLocation Where(int location) {
  cudaMemLocation l{};
  l.type = location == kHost ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  l.id = location == kHost ? 0 : location;
  return l;
}

int FromCudaLocation(int v) {
  if (v == cudaCpuDeviceId) return kHost;
  if (v == cudaInvalidDeviceId) return kNowhere;
  return v;
}

struct Driver {
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  bool ok = false;
};

template <typename F>
bool Resolve(const char* symbol, F* out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(symbol, &fn, 10020, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return false;
  }
  *out = reinterpret_cast<F>(fn);
  return true;
}

const Driver& GetDriver() {
  static const Driver* d = [] {
    auto* r = new Driver;
    r->ok = Resolve("cuMemGetAllocationGranularity", &r->granularity) &&
            Resolve("cuMemCreate", &r->create) && Resolve("cuMemRelease", &r->release) &&
            Resolve("cuMemAddressReserve", &r->reserve) &&
            Resolve("cuMemAddressFree", &r->address_free) && Resolve("cuMemMap", &r->map) &&
            Resolve("cuMemUnmap", &r->unmap) && Resolve("cuMemSetAccess", &r->set_access) &&
            Resolve("cuMemExportToShareableHandle", &r->export_handle) &&
            Resolve("cuMemImportFromShareableHandle", &r->import_handle);
    return r;
  }();
  return *d;
}

#define NEED_DRIVER()                                   \
  const Driver& drv = GetDriver();                      \
  if (!drv.ok) return Err::kNotSupported

CUmemAllocationProp Prop(int device, bool posix_fd) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes =
      posix_fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}

cudaStream_t S(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t E(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

const char* LastCudaError() { return last_error; }

Err DeviceCount(int* count) { return Fold(cudaGetDeviceCount(count)); }
Err GetDevice(int* device) { return Fold(cudaGetDevice(device)); }
Err SetDevice(int device) { return Fold(cudaSetDevice(device)); }

Err GetDeviceInfo(int device, DeviceInfo* info) {
  cudaDeviceProp p;
  const Err e = Fold(cudaGetDeviceProperties(&p, device));
  if (e != Err::kSuccess) return e;
  std::memset(info, 0, sizeof(*info));
  std::snprintf(info->name, sizeof(info->name), "%s", p.name);
  info->total_bytes = p.totalGlobalMem;
  info->major = p.major;
  info->minor = p.minor;
  info->multiprocessors = p.multiProcessorCount;
  info->warp_size = p.warpSize;
  info->max_threads_per_block = p.maxThreadsPerBlock;
  info->l2_cache_bytes = p.l2CacheSize;
  info->pci_bus = p.pciBusID;
  info->pci_device = p.pciDeviceID;
  info->pci_domain = p.pciDomainID;
  info->integrated = p.integrated;
  return Err::kSuccess;
}

Err GetAttribute(int device, Attr attr, int* value) {
  cudaDeviceAttr a;
  switch (attr) {
    case Attr::kConcurrentManagedAccess: a = cudaDevAttrConcurrentManagedAccess; break;
    case Attr::kPageableMemoryAccess: a = cudaDevAttrPageableMemoryAccess; break;
    case Attr::kPageableMemoryAccessUsesHostPageTables:
      a = cudaDevAttrPageableMemoryAccessUsesHostPageTables;
      break;
    case Attr::kManagedMemory: a = cudaDevAttrManagedMemory; break;
    case Attr::kDirectManagedMemAccessFromHost: a = cudaDevAttrDirectManagedMemAccessFromHost; break;
    case Attr::kComputeCapabilityMajor: a = cudaDevAttrComputeCapabilityMajor; break;
    case Attr::kComputeCapabilityMinor: a = cudaDevAttrComputeCapabilityMinor; break;
    case Attr::kMultiprocessorCount: a = cudaDevAttrMultiProcessorCount; break;
    case Attr::kIntegrated: a = cudaDevAttrIntegrated; break;
    default: return Err::kInvalidValue;
  }
  return Fold(cudaDeviceGetAttribute(value, a, device));
}

Err RuntimeVersion(int* version) { return Fold(cudaRuntimeGetVersion(version)); }
Err DriverVersion(int* version) { return Fold(cudaDriverGetVersion(version)); }
Err MemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes) {
  return Fold(cudaMemGetInfo(free_bytes, total_bytes));
}

Err MallocManaged(void** ptr, std::size_t bytes, bool attach_host) {
  return Fold(cudaMallocManaged(ptr, bytes, attach_host ? cudaMemAttachHost : cudaMemAttachGlobal));
}
Err Free(void* ptr) { return Fold(cudaFree(ptr)); }

Err Advise(const void* ptr, std::size_t bytes, Advice advice, int location) {
  cudaMemoryAdvise a;
  switch (advice) {
    case Advice::kSetReadMostly: a = cudaMemAdviseSetReadMostly; break;
    case Advice::kUnsetReadMostly: a = cudaMemAdviseUnsetReadMostly; break;
    case Advice::kSetPreferredLocation: a = cudaMemAdviseSetPreferredLocation; break;
    case Advice::kUnsetPreferredLocation: a = cudaMemAdviseUnsetPreferredLocation; break;
    case Advice::kSetAccessedBy: a = cudaMemAdviseSetAccessedBy; break;
    case Advice::kUnsetAccessedBy: a = cudaMemAdviseUnsetAccessedBy; break;
    default: return Err::kInvalidValue;
  }
  return Fold(cudaMemAdvise(ptr, bytes, a, Where(location)));
}

Err Prefetch(const void* ptr, std::size_t bytes, int location, void* stream) {
  return Fold(cudaMemPrefetchAsync(ptr, bytes, Where(location), 0, S(stream)));
}

Err RangeAttribute(int* out, std::size_t count, RangeAttr attr, const void* ptr,
                   std::size_t bytes) {
  cudaMemRangeAttribute a;
  switch (attr) {
    case RangeAttr::kReadMostly: a = cudaMemRangeAttributeReadMostly; break;
    case RangeAttr::kPreferredLocation: a = cudaMemRangeAttributePreferredLocation; break;
    case RangeAttr::kAccessedBy: a = cudaMemRangeAttributeAccessedBy; break;
    case RangeAttr::kLastPrefetchLocation: a = cudaMemRangeAttributeLastPrefetchLocation; break;
    default: return Err::kInvalidValue;
  }
  const Err e = Fold(cudaMemRangeGetAttribute(out, count * sizeof(int), a, ptr, bytes));
  if (e != Err::kSuccess || attr == RangeAttr::kReadMostly) return e;
  for (std::size_t i = 0; i < count; ++i) out[i] = FromCudaLocation(out[i]);
  return e;
}

Err StreamCreate(void** stream, bool non_blocking) {
  cudaStream_t s = nullptr;
  const Err e = Fold(cudaStreamCreateWithFlags(&s, non_blocking ? cudaStreamNonBlocking
                                                                : cudaStreamDefault));
  *stream = s;
  return e;
}
Err StreamDestroy(void* stream) { return Fold(cudaStreamDestroy(S(stream))); }
Err StreamSynchronize(void* stream) { return Fold(cudaStreamSynchronize(S(stream))); }
Err StreamQuery(void* stream) { return Fold(cudaStreamQuery(S(stream))); }
Err LaunchHostFunc(void* stream, void (*fn)(void*), void* data) {
  return Fold(cudaLaunchHostFunc(S(stream), fn, data));
}
Err StreamNonBlocking(void* stream, bool* non_blocking) {
  unsigned int flags = 0;
  const Err e = Fold(cudaStreamGetFlags(S(stream), &flags));
  *non_blocking = (flags & cudaStreamNonBlocking) != 0;
  return e;
}
Err StreamWaitEvent(void* stream, void* event) {
  return Fold(cudaStreamWaitEvent(S(stream), E(event), 0));
}

Err EventCreate(void** event, bool disable_timing, bool blocking_sync, bool interprocess) {
  unsigned int flags = cudaEventDefault;
  if (disable_timing) flags |= cudaEventDisableTiming;
  if (blocking_sync) flags |= cudaEventBlockingSync;
  if (interprocess) flags |= cudaEventInterprocess;
  cudaEvent_t ev = nullptr;
  const Err e = Fold(cudaEventCreateWithFlags(&ev, flags));
  *event = ev;
  return e;
}
Err EventDestroy(void* event) { return Fold(cudaEventDestroy(E(event))); }
Err EventRecord(void* event, void* stream) { return Fold(cudaEventRecord(E(event), S(stream))); }
Err EventQuery(void* event) { return Fold(cudaEventQuery(E(event))); }
Err EventSynchronize(void* event) { return Fold(cudaEventSynchronize(E(event))); }

Err VmmGranularity(int device, bool posix_fd, bool recommended, std::size_t* granularity) {
  NEED_DRIVER();
  CUmemAllocationProp p = Prop(device, posix_fd);
  return Fold(drv.granularity(granularity, &p,
                              recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                                          : CU_MEM_ALLOC_GRANULARITY_MINIMUM));
}
Err VmmCreate(std::uint64_t* handle, std::size_t bytes, int device, bool posix_fd) {
  NEED_DRIVER();
  CUmemAllocationProp p = Prop(device, posix_fd);
  CUmemGenericAllocationHandle h = 0;
  const Err e = Fold(drv.create(&h, bytes, &p, 0));
  *handle = h;
  return e;
}
Err VmmRelease(std::uint64_t handle) {
  NEED_DRIVER();
  return Fold(drv.release(handle));
}
Err VmmReserve(void** ptr, std::size_t bytes, std::size_t alignment, void* hint) {
  NEED_DRIVER();
  CUdeviceptr p = 0;
  const Err e =
      Fold(drv.reserve(&p, bytes, alignment, reinterpret_cast<CUdeviceptr>(hint), 0));
  *ptr = reinterpret_cast<void*>(p);
  return e;
}
Err VmmFree(void* ptr, std::size_t bytes) {
  NEED_DRIVER();
  return Fold(drv.address_free(reinterpret_cast<CUdeviceptr>(ptr), bytes));
}
Err VmmMap(void* ptr, std::size_t bytes, std::size_t offset, std::uint64_t handle) {
  NEED_DRIVER();
  return Fold(drv.map(reinterpret_cast<CUdeviceptr>(ptr), bytes, offset, handle, 0));
}
Err VmmUnmap(void* ptr, std::size_t bytes) {
  NEED_DRIVER();
  return Fold(drv.unmap(reinterpret_cast<CUdeviceptr>(ptr), bytes));
}
Err VmmSetAccess(void* ptr, std::size_t bytes, const int* devices, const int* flags,
                 std::size_t count) {
  NEED_DRIVER();
  if (count > 64) return Err::kInvalidValue;
  CUmemAccessDesc desc[64];
  for (std::size_t i = 0; i < count; ++i) {
    desc[i] = CUmemAccessDesc{};
    desc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[i].location.id = devices[i];
    desc[i].flags = flags[i] == 3   ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                    : flags[i] == 1 ? CU_MEM_ACCESS_FLAGS_PROT_READ
                                    : CU_MEM_ACCESS_FLAGS_PROT_NONE;
  }
  return Fold(drv.set_access(reinterpret_cast<CUdeviceptr>(ptr), bytes, desc, count));
}
Err VmmExportFd(int* fd, std::uint64_t handle) {
  NEED_DRIVER();
  return Fold(drv.export_handle(fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
}
Err VmmImportFd(std::uint64_t* handle, int fd) {
  NEED_DRIVER();
  CUmemGenericAllocationHandle h = 0;
  const Err e = Fold(drv.import_handle(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  *handle = h;
  return e;
}

}  // namespace hip_on_cuda
