#include "backends/hip/hip_backend.h"

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/hip/hip_api.h"
#include "backends/hip/hip_managed_rules.h"
#include "backends/hip/hip_status.h"
#include "backends/host_function.h"

namespace cma {
namespace {

hipStream_t AsStream(Stream s) { return reinterpret_cast<hipStream_t>(s); }
hipEvent_t AsEvent(Event e) { return reinterpret_cast<hipEvent_t>(e); }
int ToHip(const Location& l) { return l.is_host() ? hipCpuDeviceId : l.device; }

#define CMA_RETURN_IF_ERROR(expr)       \
  do {                                  \
    const absl::Status cma_s_ = (expr); \
    if (!cma_s_.ok()) return cma_s_;    \
  } while (0)

#define CMA_HIP_CALL(f, ...)                                              \
  do {                                                                    \
    const hipError_t cma_e_ = hip_->f(__VA_ARGS__);                       \
    if (cma_e_ != hipSuccess) return HipStatus(*hip_, cma_e_, #f);        \
  } while (0)

class HipBackend final : public Backend {
 public:
  HipBackend(int device_count, const HipApi* hip) : device_count_(device_count), hip_(hip) {}

  const char* name() const override { return "hip"; }
  absl::StatusOr<int> DeviceCount() override { return device_count_; }

  absl::Status CheckDevice(int device) const {
    if (device < 0 || device >= device_count_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("invalid device %d: %d HIP devices are visible", device, device_count_));
    }
    return absl::OkStatus();
  }

  // Makes `device` current, returning the caller's device to restore.
  absl::StatusOr<int> Switch(int device) {
    int previous = 0;
    CMA_HIP_CALL(hipGetDevice, &previous);
    if (previous != device) CMA_HIP_CALL(hipSetDevice, device);
    return previous;
  }

  absl::StatusOr<DeviceFacts> GetDeviceFacts(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    hipDeviceProp_t prop;
    CMA_HIP_CALL(hipGetDeviceProperties, &prop, device);
    DeviceFacts f;
    f.name = prop.name;
    f.total_bytes = prop.totalGlobalMem;
    int v = 0;
    CMA_HIP_CALL(hipDeviceGetAttribute, &v, hipDeviceAttributeConcurrentManagedAccess, device);
    f.concurrent_managed_access = v != 0;
    CMA_HIP_CALL(hipDeviceGetAttribute, &v, hipDeviceAttributePageableMemoryAccess, device);
    f.pageable_memory_access = v != 0;
    // ROCm's rules (hip_managed_rules.h): the target name's xnack feature
    // tells whether faults migrate; HSA_XNACK only explains why not.
    HipManagedInputs in;
    in.arch_name = prop.gcnArchName;
    in.concurrent_managed_access = f.concurrent_managed_access;
    in.pageable_memory_access = f.pageable_memory_access;
    if (const char* x = std::getenv("HSA_XNACK")) {
      in.has_hsa_xnack = true;
      in.hsa_xnack = x;
    }
    const HipManagedMode mode = DecideHipManagedMode(in);
    f.page_fault_migration = mode.page_fault_migration;
    f.xnack = XnackName(mode.xnack);
    f.managed_memory_note = mode.note;
    int version = 0;
    if (hip_->hipRuntimeGetVersion != nullptr && hip_->hipRuntimeGetVersion(&version) == hipSuccess) {
      f.runtime = absl::StrCat("HIP ", version, " (", hip_->library, ")");
    } else {
      f.runtime = absl::StrCat("HIP (", hip_->library, ")");
    }
    absl::StatusOr<std::size_t> g = VmmGranularity(device);
    f.vmm_supported = g.ok() && *g > 0;
    f.vmm_granularity = f.vmm_supported ? *g : 0;
    f.posix_fd_handles = f.vmm_supported;
    f.fabric_handles = false;
    f.multicast_supported = false;
    return f;
  }

  absl::StatusOr<MemInfo> GetMemInfo(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    absl::StatusOr<int> prev = Switch(device);
    if (!prev.ok()) return prev.status();
    MemInfo m;
    const hipError_t e = hip_->hipMemGetInfo(&m.free_bytes, &m.total_bytes);
    (void)hip_->hipSetDevice(*prev);  // restoring: the call's own error matters more
    if (e != hipSuccess) return HipStatus(*hip_, e, "hipMemGetInfo");
    return m;
  }

  absl::StatusOr<void*> AllocateManaged(int device, std::size_t bytes) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    absl::StatusOr<int> prev = Switch(device);
    if (!prev.ok()) return prev.status();
    void* p = nullptr;
    const hipError_t e = hip_->hipMallocManaged(&p, bytes, hipMemAttachGlobal);
    (void)hip_->hipSetDevice(*prev);  // restoring: the call's own error matters more
    if (e != hipSuccess) return HipStatus(*hip_, e, "hipMallocManaged");
    return p;
  }

  absl::Status FreeManaged(void* ptr) override {
    CMA_HIP_CALL(hipFree, ptr);
    return absl::OkStatus();
  }

  absl::Status Advise(void* ptr, std::size_t bytes, Advice advice, Location location) override {
    hipMemoryAdvise a;
    switch (advice) {
      case Advice::kSetReadMostly: a = hipMemAdviseSetReadMostly; break;
      case Advice::kUnsetReadMostly: a = hipMemAdviseUnsetReadMostly; break;
      case Advice::kSetPreferredLocation: a = hipMemAdviseSetPreferredLocation; break;
      case Advice::kUnsetPreferredLocation: a = hipMemAdviseUnsetPreferredLocation; break;
      case Advice::kSetAccessedBy: a = hipMemAdviseSetAccessedBy; break;
      case Advice::kUnsetAccessedBy: a = hipMemAdviseUnsetAccessedBy; break;
      case Advice::kSetCoarseGrain: a = hipMemAdviseSetCoarseGrain; break;
      case Advice::kUnsetCoarseGrain: a = hipMemAdviseUnsetCoarseGrain; break;
      default: return absl::InvalidArgumentError("hipMemAdvise: unknown advice");
    }
    CMA_HIP_CALL(hipMemAdvise, ptr, bytes, a, ToHip(location));
    return absl::OkStatus();
  }

  absl::Status Prefetch(void* ptr, std::size_t bytes, Location location, Stream stream) override {
    CMA_HIP_CALL(hipMemPrefetchAsync, ptr, bytes, ToHip(location), AsStream(stream));
    return absl::OkStatus();
  }

  absl::Status PrefetchBatch(absl::Span<const Range> ranges, Location location,
                             Stream stream) override {
    for (const Range& r : ranges) CMA_RETURN_IF_ERROR(Prefetch(r.ptr, r.bytes, location, stream));
    return absl::OkStatus();
  }

  absl::Status DiscardBatch(absl::Span<const Range>, Stream) override {
    return absl::OkStatus();  // HIP has no discard; keeping the contents is allowed
  }

  absl::Status DiscardAndPrefetchBatch(absl::Span<const Range> ranges, Location location,
                                       Stream stream) override {
    return PrefetchBatch(ranges, location, stream);
  }

  absl::StatusOr<RangeAttributes> GetRangeAttributes(void* ptr, std::size_t bytes) override {
    RangeAttributes a;
    int v = 0;
    CMA_HIP_CALL(hipMemRangeGetAttribute, &v, sizeof(v), hipMemRangeAttributeReadMostly, ptr, bytes);
    a.read_mostly = v != 0;
    int loc = hipInvalidDeviceId;
    CMA_HIP_CALL(hipMemRangeGetAttribute, &loc, sizeof(loc), hipMemRangeAttributePreferredLocation,
                 ptr, bytes);
    a.has_preferred_location = loc != hipInvalidDeviceId;
    a.preferred_location = loc == hipCpuDeviceId ? Location::Host() : Location::Device(loc);
    CMA_HIP_CALL(hipMemRangeGetAttribute, &loc, sizeof(loc),
                 hipMemRangeAttributeLastPrefetchLocation, ptr, bytes);
    a.has_last_prefetch = loc != hipInvalidDeviceId;
    a.last_prefetch_location = loc == hipCpuDeviceId ? Location::Host() : Location::Device(loc);
    std::vector<int> by(device_count_ + 1, hipInvalidDeviceId);
    CMA_HIP_CALL(hipMemRangeGetAttribute, by.data(), by.size() * sizeof(int),
                 hipMemRangeAttributeAccessedBy, ptr, bytes);
    for (int d : by) {
      if (d >= 0) a.accessed_by.push_back(d);
    }
    return a;
  }

  absl::StatusOr<Stream> CreateStream(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    absl::StatusOr<int> prev = Switch(device);
    if (!prev.ok()) return prev.status();
    hipStream_t s = nullptr;
    const hipError_t e = hip_->hipStreamCreateWithFlags(&s, hipStreamNonBlocking);
    (void)hip_->hipSetDevice(*prev);  // restoring: the call's own error matters more
    if (e != hipSuccess) return HipStatus(*hip_, e, "hipStreamCreateWithFlags");
    return reinterpret_cast<Stream>(s);
  }

  absl::Status DestroyStream(Stream stream) override {
    if (stream == kDefaultStream) {
      return absl::InvalidArgumentError("DestroyStream: the default stream cannot be destroyed");
    }
    CMA_HIP_CALL(hipStreamDestroy, AsStream(stream));
    return absl::OkStatus();
  }

  absl::Status ValidateStream(int device, Stream stream) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    if (stream == kDefaultStream) return absl::OkStatus();
    // The ROCm releases that check stream handles against their own table
    // answer a stale one with hipErrorContextIsDestroyed (kInvalidArgument
    // here); later clr releases dereference the handle unchecked, so this
    // catches a stale stream only where the runtime does. (No
    // hipStreamGetDevice before ROCm 6: the stream's device is not checked.)
    unsigned int flags = 0;
    CMA_HIP_CALL(hipStreamGetFlags, AsStream(stream), &flags);
    return absl::OkStatus();
  }

  absl::Status SynchronizeStream(Stream stream) override {
    CMA_HIP_CALL(hipStreamSynchronize, AsStream(stream));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryStream(Stream stream) override {
    const hipError_t e = hip_->hipStreamQuery(AsStream(stream));
    if (e == hipSuccess) return true;
    if (e == hipErrorNotReady) return false;
    return HipStatus(*hip_, e, "hipStreamQuery");
  }

  absl::Status LaunchHostFunction(Stream stream, HostFunction fn) override {
    if (hip_->hipLaunchHostFunc == nullptr) {
      return absl::UnimplementedError(absl::StrCat(hip_->library, " lacks hipLaunchHostFunc"));
    }
    void* data = NewHostFunction(std::move(fn));
    const hipError_t e = hip_->hipLaunchHostFunc(AsStream(stream), RunHostFunction, data);
    if (e != hipSuccess) {
      DropHostFunction(data);
      return HipStatus(*hip_, e, "hipLaunchHostFunc");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Event> CreateEvent(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    absl::StatusOr<int> prev = Switch(device);
    if (!prev.ok()) return prev.status();
    hipEvent_t ev = nullptr;
    const hipError_t e = hip_->hipEventCreateWithFlags(&ev, hipEventDisableTiming);
    (void)hip_->hipSetDevice(*prev);  // restoring: the call's own error matters more
    if (e != hipSuccess) return HipStatus(*hip_, e, "hipEventCreateWithFlags");
    return reinterpret_cast<Event>(ev);
  }

  absl::Status DestroyEvent(Event event) override {
    CMA_HIP_CALL(hipEventDestroy, AsEvent(event));
    return absl::OkStatus();
  }

  absl::Status RecordEvent(Event event, Stream stream) override {
    CMA_HIP_CALL(hipEventRecord, AsEvent(event), AsStream(stream));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryEvent(Event event) override {
    const hipError_t e = hip_->hipEventQuery(AsEvent(event));
    if (e == hipSuccess) return true;
    if (e == hipErrorNotReady) return false;
    return HipStatus(*hip_, e, "hipEventQuery");
  }

  absl::Status SynchronizeEvent(Event event) override {
    CMA_HIP_CALL(hipEventSynchronize, AsEvent(event));
    return absl::OkStatus();
  }

  absl::Status StreamWaitEvent(Stream stream, Event event) override {
    CMA_HIP_CALL(hipStreamWaitEvent, AsStream(stream), AsEvent(event), 0);
    return absl::OkStatus();
  }

  // ---- VMM: where this ROCm and device provide it ----
  static hipMemAllocationProp Prop(int device) {
    hipMemAllocationProp p{};
    p.type = hipMemAllocationTypePinned;
    p.location.type = hipMemLocationTypeDevice;
    p.location.id = device;
    p.requestedHandleType = hipMemHandleTypePosixFileDescriptor;
    return p;
  }

  absl::Status Unsupported(hipError_t e, const char* call) {
    if (e == hipErrorNotSupported) {
      return absl::UnimplementedError(absl::StrCat(
          call, ": virtual memory management is unsupported on this ROCm or device, so the "
                "symmetric mode is unavailable"));
    }
    return HipStatus(*hip_, e, call);
  }

  absl::StatusOr<std::size_t> VmmGranularity(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    hipMemAllocationProp p = Prop(device);
    std::size_t g = 0;
    const hipError_t e =
        hip_->hipMemGetAllocationGranularity(&g, &p, hipMemAllocationGranularityRecommended);
    if (e != hipSuccess) return Unsupported(e, "hipMemGetAllocationGranularity");
    return g;
  }

  absl::StatusOr<PhysicalHandle> VmmCreate(int device, std::size_t bytes,
                                           HandleType exportable) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    if (exportable == HandleType::kFabric) {
      return absl::UnimplementedError("hipMemCreate: HIP has no fabric handles");
    }
    hipMemAllocationProp p = Prop(device);
    hipMemGenericAllocationHandle_t h;
    // ROCm's hipMemCreate allocates on the current device and only checks
    // prop.location.id, so `device` is made current for the call.
    absl::StatusOr<int> prev = Switch(device);
    if (!prev.ok()) return prev.status();
    const hipError_t e = hip_->hipMemCreate(&h, bytes, &p, 0);
    (void)hip_->hipSetDevice(*prev);  // restoring: the call's own error matters more
    if (e != hipSuccess) return Unsupported(e, "hipMemCreate");
    return reinterpret_cast<PhysicalHandle>(h);
  }

  absl::Status VmmRelease(PhysicalHandle handle) override {
    CMA_HIP_CALL(hipMemRelease, reinterpret_cast<hipMemGenericAllocationHandle_t>(handle));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> VmmReserve(std::size_t bytes, std::size_t alignment) override {
    void* p = nullptr;
    const hipError_t e = hip_->hipMemAddressReserve(&p, bytes, alignment, nullptr, 0);
    if (e != hipSuccess) return Unsupported(e, "hipMemAddressReserve");
    return p;
  }

  absl::Status VmmFreeAddress(void* address, std::size_t bytes) override {
    CMA_HIP_CALL(hipMemAddressFree, address, bytes);
    return absl::OkStatus();
  }

  absl::Status VmmMap(void* address, std::size_t bytes, PhysicalHandle handle) override {
    CMA_HIP_CALL(hipMemMap, address, bytes, 0,
                 reinterpret_cast<hipMemGenericAllocationHandle_t>(handle), 0);
    return absl::OkStatus();
  }

  absl::Status VmmUnmap(void* address, std::size_t bytes) override {
    CMA_HIP_CALL(hipMemUnmap, address, bytes);
    return absl::OkStatus();
  }

  absl::Status VmmSetAccess(void* address, std::size_t bytes,
                            absl::Span<const int> devices) override {
    std::vector<hipMemAccessDesc> desc(devices.size());
    for (std::size_t i = 0; i < devices.size(); ++i) {
      CMA_RETURN_IF_ERROR(CheckDevice(devices[i]));
      desc[i].location.type = hipMemLocationTypeDevice;
      desc[i].location.id = devices[i];
      desc[i].flags = hipMemAccessFlagsProtReadWrite;
    }
    CMA_HIP_CALL(hipMemSetAccess, address, bytes, desc.data(), desc.size());
    return absl::OkStatus();
  }

  absl::StatusOr<ShareableHandle> VmmExport(PhysicalHandle handle, HandleType type) override {
    if (type != HandleType::kPosixFd) {
      return absl::UnimplementedError("hipMemExportToShareableHandle: HIP exports POSIX FDs only");
    }
    int fd = -1;
    CMA_HIP_CALL(hipMemExportToShareableHandle, &fd,
                 reinterpret_cast<hipMemGenericAllocationHandle_t>(handle),
                 hipMemHandleTypePosixFileDescriptor, 0);
    ShareableHandle out;
    out.fd = fd;
    return out;
  }

  absl::StatusOr<PhysicalHandle> VmmImport(const ShareableHandle& shared) override {
    if (shared.type != HandleType::kPosixFd) {
      return absl::UnimplementedError("hipMemImportFromShareableHandle: POSIX FDs only");
    }
    hipMemGenericAllocationHandle_t h;
    CMA_HIP_CALL(hipMemImportFromShareableHandle, &h,
                 reinterpret_cast<void*>(static_cast<std::intptr_t>(shared.fd)),
                 hipMemHandleTypePosixFileDescriptor);
    return reinterpret_cast<PhysicalHandle>(h);
  }

  // ---- no multicast on HIP ----
  absl::StatusOr<MulticastHandle> MulticastCreate(absl::Span<const int>, std::size_t) override {
    return absl::UnimplementedError("multicast objects do not exist on HIP");
  }
  absl::Status MulticastAddDevice(MulticastHandle, int) override {
    return absl::UnimplementedError("multicast objects do not exist on HIP");
  }
  absl::Status MulticastBindMemory(MulticastHandle, std::size_t, PhysicalHandle, std::size_t,
                                   std::size_t) override {
    return absl::UnimplementedError("multicast objects do not exist on HIP");
  }
  absl::Status MulticastRelease(MulticastHandle) override {
    return absl::UnimplementedError("multicast objects do not exist on HIP");
  }

 private:
  const int device_count_;
  const HipApi* const hip_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeHipBackend() {
  absl::StatusOr<const HipApi*> hip = HipApi::Get();
  if (!hip.ok()) return hip.status();
  int count = 0;
  const hipError_t e = (*hip)->hipGetDeviceCount(&count);
  if (e != hipSuccess || count == 0) {
    return absl::UnavailableError(absl::StrCat(
        "no HIP device is visible (hipGetDeviceCount: ",
        e == hipSuccess ? "0 devices" : (*hip)->hipGetErrorString(e), ")"));
  }
  return std::unique_ptr<Backend>(new HipBackend(count, *hip));
}

}  // namespace cma
