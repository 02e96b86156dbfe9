// The seam between the two halves of hip_on_cuda: hip_exports.cc (HIP's
// headers, HIP's names and enum values) and cuda_bridge.cc (CUDA's headers).
// The two sets of headers cannot share a translation unit (both define
// char1, uchar1, ... vector types), so nothing here names a vendor type:
// errors, advice, attributes and locations are this file's own enums, and
// streams, events and physical handles travel as opaque pointers/integers.
//
// Thread safety: every function may be called from any thread (the CUDA
// runtime's own rules apply). Test-only code: it exists to run the HIP
// backend on an NVIDIA GPU, never in the library.
#ifndef CMA_TESTS_GPU_HIP_ON_CUDA_BRIDGE_H_
#define CMA_TESTS_GPU_HIP_ON_CUDA_BRIDGE_H_

#include <cstddef>
#include <cstdint>

namespace hip_on_cuda {

// CUDA's errors, grouped into what HIP can name.
enum class Err {
  kSuccess,
  kInvalidValue,
  kOutOfMemory,
  kNotInitialized,
  kNoDevice,
  kInvalidDevice,
  kInvalidHandle,
  kInvalidDevicePointer,
  kNotReady,
  kNotSupported,
  kIllegalAddress,
  kLaunchFailure,
  kContextIsDestroyed,
  kUnknown,
};

// The last CUDA error this thread saw, as "cudaErrorX: description" (for
// hipGetErrorString; empty when none).
const char* LastCudaError();

// Locations: a device index, or these.
inline constexpr int kHost = -1;     // hipCpuDeviceId / cudaCpuDeviceId
inline constexpr int kNowhere = -2;  // hipInvalidDeviceId / cudaInvalidDeviceId

struct DeviceInfo {
  char name[256];
  std::size_t total_bytes;
  int major, minor, multiprocessors, warp_size, max_threads_per_block;
  int l2_cache_bytes, pci_bus, pci_device, pci_domain, integrated;
};

enum class Attr {
  kConcurrentManagedAccess,
  kPageableMemoryAccess,
  kPageableMemoryAccessUsesHostPageTables,
  kManagedMemory,
  kDirectManagedMemAccessFromHost,
  kComputeCapabilityMajor,
  kComputeCapabilityMinor,
  kMultiprocessorCount,
  kIntegrated,
};

enum class Advice { kSetReadMostly, kUnsetReadMostly, kSetPreferredLocation,
                    kUnsetPreferredLocation, kSetAccessedBy, kUnsetAccessedBy };

enum class RangeAttr { kReadMostly, kPreferredLocation, kAccessedBy, kLastPrefetchLocation };

Err DeviceCount(int* count);
Err GetDevice(int* device);
Err SetDevice(int device);
Err GetDeviceInfo(int device, DeviceInfo* info);
Err GetAttribute(int device, Attr attr, int* value);
Err RuntimeVersion(int* version);
Err DriverVersion(int* version);
Err MemGetInfo(std::size_t* free_bytes, std::size_t* total_bytes);

Err MallocManaged(void** ptr, std::size_t bytes, bool attach_host);
Err Free(void* ptr);
// `location`: a device, or kHost.
Err Advise(const void* ptr, std::size_t bytes, Advice advice, int location);
Err Prefetch(const void* ptr, std::size_t bytes, int location, void* stream);
// Integer-valued attributes: locations come back as a device, kHost or
// kNowhere; kAccessedBy fills `count` ints.
Err RangeAttribute(int* out, std::size_t count, RangeAttr attr, const void* ptr,
                   std::size_t bytes);

Err StreamCreate(void** stream, bool non_blocking);
Err StreamDestroy(void* stream);
Err StreamSynchronize(void* stream);
Err StreamQuery(void* stream);
// `fn(data)` on the runtime's thread once the work queued before it completes.
Err LaunchHostFunc(void* stream, void (*fn)(void*), void* data);
Err StreamNonBlocking(void* stream, bool* non_blocking);
Err StreamWaitEvent(void* stream, void* event);

Err EventCreate(void** event, bool disable_timing, bool blocking_sync, bool interprocess);
Err EventDestroy(void* event);
Err EventRecord(void* event, void* stream);
Err EventQuery(void* event);
Err EventSynchronize(void* event);

// VMM (the driver API). Access flags: 0 none, 1 read, 3 read/write.
Err VmmGranularity(int device, bool posix_fd, bool recommended, std::size_t* granularity);
Err VmmCreate(std::uint64_t* handle, std::size_t bytes, int device, bool posix_fd);
Err VmmRelease(std::uint64_t handle);
Err VmmReserve(void** ptr, std::size_t bytes, std::size_t alignment, void* hint);
Err VmmFree(void* ptr, std::size_t bytes);
Err VmmMap(void* ptr, std::size_t bytes, std::size_t offset, std::uint64_t handle);
Err VmmUnmap(void* ptr, std::size_t bytes);
Err VmmSetAccess(void* ptr, std::size_t bytes, const int* devices, const int* flags,
                 std::size_t count);
Err VmmExportFd(int* fd, std::uint64_t handle);
Err VmmImportFd(std::uint64_t* handle, int fd);

}  // namespace hip_on_cuda

#endif  // CMA_TESTS_GPU_HIP_ON_CUDA_BRIDGE_H_
