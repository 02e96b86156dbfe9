// The HIP half of hip_on_cuda: the HIP runtime entry points that
// backends/hip resolves (hip_api.h), with HIP's signatures from HIP's own
// headers, each translated to the bridge (bridge.h) and so to CUDA.
//
// It keeps the HIP conventions the backend relies on, as ROCm's runtime
// (clr/hipamd) implements them, rather than CUDA's:
//  * error codes are hipError_t (hipErrorNotReady = 600, ...), named by
//    hipGetErrorName;
//  * hipCpuDeviceId / hipInvalidDeviceId in advice and range attributes;
//  * int-device hipMemAdvise / hipMemPrefetchAsync (CUDA 13 takes a
//    cudaMemLocation); coarse-grain advice (100/101) is accepted and has no
//    effect, since CUDA's managed memory is always at least as coherent;
//  * scalar range attributes need data_size == 4, accessed-by a multiple
//    of 4 (clr returns hipErrorInvalidValue otherwise);
//  * streams are checked against a table of live streams, as the ROCm
//    releases that validate handles do: a stale or foreign stream is
//    hipErrorContextIsDestroyed, a stale event hipErrorInvalidHandle;
//  * VMM: hipMemCreate takes hipMemHandleTypeNone or a POSIX FD and is made
//    on the current device (clr ignores prop->location.id beyond checking
//    it); an export must ask for the type the handle was created with;
//    hipMemMap takes offset 0 and flags 0 only; the imported FD travels as
//    the pointer's value.
// hipGetDeviceProperties reports gcnArchName as "sm_XY" (no xnack feature)
// unless HIP_ON_CUDA_GCN_ARCH_NAME names one.
#include <hip/hip_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "tests/gpu/hip_on_cuda/bridge.h"

namespace hip_on_cuda {
namespace {

static_assert(hipCpuDeviceId == kHost && hipInvalidDeviceId == kNowhere,
              "the bridge's location values are HIP's");

thread_local hipError_t last_failure = hipSuccess;

hipError_t ToHip(Err e) {
  hipError_t h;
  switch (e) {
    case Err::kSuccess: return hipSuccess;
    case Err::kInvalidValue: h = hipErrorInvalidValue; break;
    case Err::kOutOfMemory: h = hipErrorOutOfMemory; break;
    case Err::kNotInitialized: h = hipErrorNotInitialized; break;
    case Err::kNoDevice: h = hipErrorNoDevice; break;
    case Err::kInvalidDevice: h = hipErrorInvalidDevice; break;
    case Err::kInvalidHandle: h = hipErrorInvalidHandle; break;
    case Err::kInvalidDevicePointer: h = hipErrorInvalidDevicePointer; break;
    case Err::kNotReady: return hipErrorNotReady;  // not a failure
    case Err::kNotSupported: h = hipErrorNotSupported; break;
    case Err::kIllegalAddress: h = hipErrorIllegalAddress; break;
    case Err::kLaunchFailure: h = hipErrorLaunchFailure; break;
    case Err::kContextIsDestroyed: h = hipErrorContextIsDestroyed; break;
    default: h = hipErrorUnknown; break;
  }
  last_failure = h;
  return h;
}

// Failures this file decides itself (HIP's own argument checks).
hipError_t Refuse(hipError_t h) {
  last_failure = hipSuccess;  // no CUDA error behind it
  return h;
}

std::mutex mu;
std::unordered_set<void*>& LiveStreams() {
  static auto* s = new std::unordered_set<void*>;
  return *s;
}
std::unordered_set<void*>& LiveEvents() {
  static auto* s = new std::unordered_set<void*>;
  return *s;
}
// Physical handle -> created exportable as a POSIX FD.
std::unordered_map<std::uint64_t, bool>& Handles() {
  static auto* m = new std::unordered_map<std::uint64_t, bool>;
  return *m;
}

bool StreamOk(hipStream_t s) {
  if (s == nullptr) return true;
  std::lock_guard<std::mutex> l(mu);
  return LiveStreams().count(s) != 0;
}
bool EventOk(hipEvent_t e) {
  if (e == nullptr) return false;
  std::lock_guard<std::mutex> l(mu);
  return LiveEvents().count(e) != 0;
}

int DeviceCountOrZero() {
  int n = 0;
  return DeviceCount(&n) == Err::kSuccess ? n : 0;
}

bool ValidLocation(int device) {
  return device == hipCpuDeviceId || (device >= 0 && device < DeviceCountOrZero());
}

std::uint64_t H(hipMemGenericAllocationHandle_t h) { return reinterpret_cast<std::uint64_t>(h); }

}  // namespace
}  // namespace hip_on_cuda

using namespace hip_on_cuda;  // NOLINT: this file is the bridge's HIP face

extern "C" {

const char* hipGetErrorName(hipError_t e) {
  switch (e) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNotInitialized: return "hipErrorNotInitialized";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
    case hipErrorInvalidHandle: return "hipErrorInvalidHandle";
    case hipErrorInvalidDevicePointer: return "hipErrorInvalidDevicePointer";
    case hipErrorNotReady: return "hipErrorNotReady";
    case hipErrorNotSupported: return "hipErrorNotSupported";
    case hipErrorIllegalAddress: return "hipErrorIllegalAddress";
    case hipErrorLaunchFailure: return "hipErrorLaunchFailure";
    case hipErrorContextIsDestroyed: return "hipErrorContextIsDestroyed";
    default: return "hipErrorUnknown";
  }
}

const char* hipGetErrorString(hipError_t e) {
  const char* text;
  switch (e) {
    case hipSuccess: text = "no error"; break;
    case hipErrorInvalidValue: text = "invalid argument"; break;
    case hipErrorOutOfMemory: text = "out of memory"; break;
    case hipErrorNotInitialized: text = "initialization error"; break;
    case hipErrorNoDevice: text = "no ROCm-capable device is detected"; break;
    case hipErrorInvalidDevice: text = "invalid device ordinal"; break;
    case hipErrorInvalidHandle: text = "invalid resource handle"; break;
    case hipErrorInvalidDevicePointer: text = "invalid device pointer"; break;
    case hipErrorNotReady: text = "device not ready"; break;
    case hipErrorNotSupported: text = "operation not supported"; break;
    case hipErrorIllegalAddress: text = "an illegal memory access was encountered"; break;
    case hipErrorLaunchFailure: text = "unspecified launch failure"; break;
    case hipErrorContextIsDestroyed: text = "context is destroyed"; break;
    default: text = "unknown error"; break;
  }
  if (e == hipSuccess || e != last_failure || LastCudaError()[0] == '\0') return text;
  thread_local char buf[512];
  std::snprintf(buf, sizeof(buf), "%s [hip_on_cuda: %s]", text, LastCudaError());
  return buf;
}

hipError_t hipGetDeviceCount(int* count) {
  if (count == nullptr) return Refuse(hipErrorInvalidValue);
  const hipError_t e = ToHip(DeviceCount(count));
  if (e == hipSuccess && *count == 0) return Refuse(hipErrorNoDevice);
  return e;
}

hipError_t hipGetDevice(int* device) {
  if (device == nullptr) return Refuse(hipErrorInvalidValue);
  return ToHip(GetDevice(device));
}

hipError_t hipSetDevice(int device) {
  if (device < 0 || device >= DeviceCountOrZero()) return Refuse(hipErrorInvalidDevice);
  return ToHip(SetDevice(device));
}

hipError_t hipRuntimeGetVersion(int* version) {
  if (version == nullptr) return Refuse(hipErrorInvalidValue);
  *version = HIP_VERSION;  // the HIP API these exports were compiled against
  return hipSuccess;
}

hipError_t hipDriverGetVersion(int* version) {
  if (version == nullptr) return Refuse(hipErrorInvalidValue);
  return ToHip(DriverVersion(version));  // the CUDA driver's
}

hipError_t hipGetDeviceProperties(hipDeviceProp_t* prop, int device) {
  if (prop == nullptr) return Refuse(hipErrorInvalidValue);
  if (device < 0 || device >= DeviceCountOrZero()) return Refuse(hipErrorInvalidDevice);
  DeviceInfo info;
  const hipError_t e = ToHip(GetDeviceInfo(device, &info));
  if (e != hipSuccess) return e;
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "%s", info.name);
  prop->totalGlobalMem = info.total_bytes;
  prop->major = info.major;
  prop->minor = info.minor;
  prop->multiProcessorCount = info.multiprocessors;
  prop->warpSize = info.warp_size;
  prop->maxThreadsPerBlock = info.max_threads_per_block;
  prop->l2CacheSize = info.l2_cache_bytes;
  prop->pciBusID = info.pci_bus;
  prop->pciDeviceID = info.pci_device;
  prop->pciDomainID = info.pci_domain;
  prop->integrated = info.integrated;
  const char* arch = std::getenv("HIP_ON_CUDA_GCN_ARCH_NAME");
  if (arch != nullptr) {
    std::snprintf(prop->gcnArchName, sizeof(prop->gcnArchName), "%s", arch);
  } else {
    std::snprintf(prop->gcnArchName, sizeof(prop->gcnArchName), "sm_%d%d", info.major,
                  info.minor);
  }
  int v = 0;
  if (GetAttribute(device, Attr::kManagedMemory, &v) == Err::kSuccess) prop->managedMemory = v;
  if (GetAttribute(device, Attr::kConcurrentManagedAccess, &v) == Err::kSuccess) {
    prop->concurrentManagedAccess = v;
  }
  if (GetAttribute(device, Attr::kPageableMemoryAccess, &v) == Err::kSuccess) {
    prop->pageableMemoryAccess = v;
  }
  return hipSuccess;
}

hipError_t hipDeviceGetAttribute(int* value, hipDeviceAttribute_t attr, int device) {
  if (value == nullptr) return Refuse(hipErrorInvalidValue);
  if (device < 0 || device >= DeviceCountOrZero()) return Refuse(hipErrorInvalidDevice);
  Attr a;
  switch (attr) {
    case hipDeviceAttributeConcurrentManagedAccess: a = Attr::kConcurrentManagedAccess; break;
    case hipDeviceAttributePageableMemoryAccess: a = Attr::kPageableMemoryAccess; break;
    case hipDeviceAttributePageableMemoryAccessUsesHostPageTables:
      a = Attr::kPageableMemoryAccessUsesHostPageTables;
      break;
    case hipDeviceAttributeManagedMemory: a = Attr::kManagedMemory; break;
    case hipDeviceAttributeDirectManagedMemAccessFromHost:
      a = Attr::kDirectManagedMemAccessFromHost;
      break;
    case hipDeviceAttributeComputeCapabilityMajor: a = Attr::kComputeCapabilityMajor; break;
    case hipDeviceAttributeComputeCapabilityMinor: a = Attr::kComputeCapabilityMinor; break;
    case hipDeviceAttributeMultiprocessorCount: a = Attr::kMultiprocessorCount; break;
    case hipDeviceAttributeIntegrated: a = Attr::kIntegrated; break;
    default: return Refuse(hipErrorInvalidValue);  // not translated
  }
  return ToHip(GetAttribute(device, a, value));
}

hipError_t hipMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return Refuse(hipErrorInvalidValue);
  return ToHip(MemGetInfo(free_bytes, total_bytes));
}

hipError_t hipMallocManaged(void** ptr, size_t bytes, unsigned int flags) {
  if (ptr == nullptr) return Refuse(hipErrorInvalidValue);
  if (flags != hipMemAttachGlobal && flags != hipMemAttachHost) {
    return Refuse(hipErrorInvalidValue);
  }
  return ToHip(MallocManaged(ptr, bytes, flags == hipMemAttachHost));
}

hipError_t hipFree(void* ptr) {
  if (ptr == nullptr) return hipSuccess;
  return ToHip(Free(ptr));
}

hipError_t hipMemAdvise(const void* ptr, size_t count, hipMemoryAdvise advice, int device) {
  if (ptr == nullptr || count == 0 || !ValidLocation(device)) return Refuse(hipErrorInvalidValue);
  Advice a;
  switch (advice) {
    case hipMemAdviseSetReadMostly: a = Advice::kSetReadMostly; break;
    case hipMemAdviseUnsetReadMostly: a = Advice::kUnsetReadMostly; break;
    case hipMemAdviseSetPreferredLocation: a = Advice::kSetPreferredLocation; break;
    case hipMemAdviseUnsetPreferredLocation: a = Advice::kUnsetPreferredLocation; break;
    case hipMemAdviseSetAccessedBy: a = Advice::kSetAccessedBy; break;
    case hipMemAdviseUnsetAccessedBy: a = Advice::kUnsetAccessedBy; break;
    case hipMemAdviseSetCoarseGrain:
    case hipMemAdviseUnsetCoarseGrain: return hipSuccess;  // see the file comment
    default: return Refuse(hipErrorInvalidValue);
  }
  return ToHip(Advise(ptr, count, a, device));
}

hipError_t hipMemPrefetchAsync(const void* ptr, size_t count, int device, hipStream_t stream) {
  if (ptr == nullptr || count == 0 || !ValidLocation(device)) return Refuse(hipErrorInvalidValue);
  if (!StreamOk(stream)) return Refuse(hipErrorContextIsDestroyed);
  return ToHip(Prefetch(ptr, count, device, stream));
}

hipError_t hipMemRangeGetAttribute(void* data, size_t data_size, hipMemRangeAttribute attribute,
                                   const void* ptr, size_t count) {
  if (data == nullptr || ptr == nullptr || count == 0) return Refuse(hipErrorInvalidValue);
  RangeAttr a;
  switch (attribute) {
    case hipMemRangeAttributeReadMostly: a = RangeAttr::kReadMostly; break;
    case hipMemRangeAttributePreferredLocation: a = RangeAttr::kPreferredLocation; break;
    case hipMemRangeAttributeLastPrefetchLocation: a = RangeAttr::kLastPrefetchLocation; break;
    case hipMemRangeAttributeAccessedBy: a = RangeAttr::kAccessedBy; break;
    default: return Refuse(hipErrorInvalidValue);
  }
  if (a == RangeAttr::kAccessedBy ? data_size % 4 != 0 || data_size == 0 : data_size != 4) {
    return Refuse(hipErrorInvalidValue);
  }
  return ToHip(RangeAttribute(static_cast<int*>(data), data_size / 4, a, ptr, count));
}

hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags) {
  if (stream == nullptr || (flags != hipStreamDefault && flags != hipStreamNonBlocking)) {
    return Refuse(hipErrorInvalidValue);
  }
  void* s = nullptr;
  const hipError_t e = ToHip(StreamCreate(&s, flags == hipStreamNonBlocking));
  if (e != hipSuccess) return e;
  std::lock_guard<std::mutex> l(mu);
  LiveStreams().insert(s);
  *stream = static_cast<hipStream_t>(s);
  return hipSuccess;
}

hipError_t hipStreamDestroy(hipStream_t stream) {
  if (stream == nullptr) return Refuse(hipErrorInvalidHandle);
  {
    std::lock_guard<std::mutex> l(mu);
    if (LiveStreams().erase(stream) == 0) return Refuse(hipErrorContextIsDestroyed);
  }
  return ToHip(StreamDestroy(stream));
}

hipError_t hipStreamSynchronize(hipStream_t stream) {
  if (!StreamOk(stream)) return Refuse(hipErrorContextIsDestroyed);
  return ToHip(StreamSynchronize(stream));
}

hipError_t hipStreamQuery(hipStream_t stream) {
  if (!StreamOk(stream)) return Refuse(hipErrorContextIsDestroyed);
  return ToHip(StreamQuery(stream));
}

hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void* data) {
  if (fn == nullptr) return Refuse(hipErrorInvalidValue);
  if (!StreamOk(stream)) return Refuse(hipErrorContextIsDestroyed);
  return ToHip(LaunchHostFunc(stream, fn, data));
}

hipError_t hipStreamGetFlags(hipStream_t stream, unsigned int* flags) {
  if (stream == nullptr || flags == nullptr) return Refuse(hipErrorInvalidValue);
  if (!StreamOk(stream)) return Refuse(hipErrorContextIsDestroyed);
  bool non_blocking = false;
  const hipError_t e = ToHip(StreamNonBlocking(stream, &non_blocking));
  if (e == hipSuccess) *flags = non_blocking ? hipStreamNonBlocking : hipStreamDefault;
  return e;
}

hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags) {
  if (flags != 0) return Refuse(hipErrorInvalidValue);
  if (!EventOk(event)) return Refuse(hipErrorInvalidHandle);
  if (!StreamOk(stream)) return Refuse(hipErrorContextIsDestroyed);
  return ToHip(StreamWaitEvent(stream, event));
}

hipError_t hipEventCreateWithFlags(hipEvent_t* event, unsigned flags) {
  constexpr unsigned kKnown = hipEventDefault | hipEventBlockingSync | hipEventDisableTiming |
                              hipEventInterprocess;
  if (event == nullptr || (flags & ~kKnown) != 0) return Refuse(hipErrorInvalidValue);
  void* e = nullptr;
  const hipError_t r = ToHip(EventCreate(&e, (flags & hipEventDisableTiming) != 0,
                                         (flags & hipEventBlockingSync) != 0,
                                         (flags & hipEventInterprocess) != 0));
  if (r != hipSuccess) return r;
  std::lock_guard<std::mutex> l(mu);
  LiveEvents().insert(e);
  *event = static_cast<hipEvent_t>(e);
  return hipSuccess;
}

hipError_t hipEventDestroy(hipEvent_t event) {
  {
    std::lock_guard<std::mutex> l(mu);
    if (event == nullptr || LiveEvents().erase(event) == 0) return Refuse(hipErrorInvalidHandle);
  }
  return ToHip(EventDestroy(event));
}

hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream) {
  if (!EventOk(event)) return Refuse(hipErrorInvalidHandle);
  if (!StreamOk(stream)) return Refuse(hipErrorContextIsDestroyed);
  return ToHip(EventRecord(event, stream));
}

hipError_t hipEventQuery(hipEvent_t event) {
  if (!EventOk(event)) return Refuse(hipErrorInvalidHandle);
  return ToHip(EventQuery(event));
}

hipError_t hipEventSynchronize(hipEvent_t event) {
  if (!EventOk(event)) return Refuse(hipErrorInvalidHandle);
  return ToHip(EventSynchronize(event));
}

// ---- VMM ----

static bool PropOk(const hipMemAllocationProp* prop) {
  return prop != nullptr && prop->type == hipMemAllocationTypePinned &&
         prop->location.type == hipMemLocationTypeDevice && prop->location.id >= 0 &&
         prop->location.id < DeviceCountOrZero();
}

hipError_t hipMemGetAllocationGranularity(size_t* granularity, const hipMemAllocationProp* prop,
                                          hipMemAllocationGranularity_flags option) {
  if (granularity == nullptr || !PropOk(prop) ||
      (option != hipMemAllocationGranularityMinimum &&
       option != hipMemAllocationGranularityRecommended)) {
    return Refuse(hipErrorInvalidValue);
  }
  return ToHip(VmmGranularity(prop->location.id,
                              prop->requestedHandleType == hipMemHandleTypePosixFileDescriptor,
                              option == hipMemAllocationGranularityRecommended, granularity));
}

hipError_t hipMemCreate(hipMemGenericAllocationHandle_t* handle, size_t size,
                        const hipMemAllocationProp* prop, unsigned long long flags) {
  if (handle == nullptr || size == 0 || flags != 0 || !PropOk(prop)) {
    return Refuse(hipErrorInvalidValue);
  }
  if (prop->requestedHandleType != hipMemHandleTypeNone &&
      prop->requestedHandleType != hipMemHandleTypePosixFileDescriptor) {
    return Refuse(hipErrorNotSupported);
  }
  int current = 0;
  hipError_t e = ToHip(GetDevice(&current));
  if (e != hipSuccess) return e;
  const bool fd = prop->requestedHandleType == hipMemHandleTypePosixFileDescriptor;
  std::uint64_t h = 0;
  e = ToHip(VmmCreate(&h, size, current, fd));  // clr: the current device's
  if (e != hipSuccess) return e;
  std::lock_guard<std::mutex> l(mu);
  Handles()[h] = fd;
  *handle = reinterpret_cast<hipMemGenericAllocationHandle_t>(h);
  return hipSuccess;
}

hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle) {
  if (handle == nullptr) return Refuse(hipErrorInvalidValue);
  {
    std::lock_guard<std::mutex> l(mu);
    Handles().erase(H(handle));
  }
  return ToHip(VmmRelease(H(handle)));
}

hipError_t hipMemAddressReserve(void** ptr, size_t size, size_t alignment, void* addr,
                                unsigned long long flags) {
  if (ptr == nullptr || flags != 0) return Refuse(hipErrorInvalidValue);
  if (size == 0 || (alignment & (alignment - 1)) != 0) return Refuse(hipErrorOutOfMemory);
  return ToHip(VmmReserve(ptr, size, alignment, addr));
}

hipError_t hipMemAddressFree(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0) return Refuse(hipErrorInvalidValue);
  return ToHip(VmmFree(ptr, size));
}

hipError_t hipMemMap(void* ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
                     unsigned long long flags) {
  if (ptr == nullptr || handle == nullptr || size == 0 || offset != 0 || flags != 0) {
    return Refuse(hipErrorInvalidValue);
  }
  return ToHip(VmmMap(ptr, size, offset, H(handle)));
}

hipError_t hipMemUnmap(void* ptr, size_t size) {
  if (ptr == nullptr || size == 0) return Refuse(hipErrorInvalidValue);
  return ToHip(VmmUnmap(ptr, size));
}

hipError_t hipMemSetAccess(void* ptr, size_t size, const hipMemAccessDesc* desc, size_t count) {
  if (ptr == nullptr || size == 0 || desc == nullptr || count == 0 || count > 64) {
    return Refuse(hipErrorInvalidValue);
  }
  int devices[64], flags[64];
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != hipMemLocationTypeDevice || desc[i].location.id < 0 ||
        desc[i].location.id >= DeviceCountOrZero()) {
      return Refuse(hipErrorInvalidValue);
    }
    if (desc[i].flags != hipMemAccessFlagsProtNone && desc[i].flags != hipMemAccessFlagsProtRead &&
        desc[i].flags != hipMemAccessFlagsProtReadWrite) {
      return Refuse(hipErrorInvalidValue);
    }
    devices[i] = desc[i].location.id;
    flags[i] = static_cast<int>(desc[i].flags);
  }
  return ToHip(VmmSetAccess(ptr, size, devices, flags, count));
}

hipError_t hipMemExportToShareableHandle(void* shareable, hipMemGenericAllocationHandle_t handle,
                                         hipMemAllocationHandleType type,
                                         unsigned long long flags) {
  if (flags != 0 || handle == nullptr || shareable == nullptr) return Refuse(hipErrorInvalidValue);
  {
    std::lock_guard<std::mutex> l(mu);
    auto it = Handles().find(H(handle));
    // clr: the handle must have been created exportable as `type`.
    if (it == Handles().end() || !it->second || type != hipMemHandleTypePosixFileDescriptor) {
      return Refuse(hipErrorInvalidValue);
    }
  }
  return ToHip(VmmExportFd(static_cast<int*>(shareable), H(handle)));
}

hipError_t hipMemImportFromShareableHandle(hipMemGenericAllocationHandle_t* handle,
                                           void* os_handle, hipMemAllocationHandleType type) {
  if (handle == nullptr || os_handle == nullptr) return Refuse(hipErrorInvalidValue);
  if (type != hipMemHandleTypePosixFileDescriptor) return Refuse(hipErrorNotSupported);
  std::uint64_t h = 0;
  const hipError_t e =
      ToHip(VmmImportFd(&h, static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle))));
  if (e != hipSuccess) return e;
  std::lock_guard<std::mutex> l(mu);
  Handles()[h] = true;
  *handle = reinterpret_cast<hipMemGenericAllocationHandle_t>(h);
  return hipSuccess;
}

}  // extern "C"
