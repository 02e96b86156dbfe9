#include "backends/mutex_lock.h"
#include "backends/cuda/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_format.h"
#include "backends/cuda/cuda_capture.h"
#include "backends/cuda/cuda_pinned.h"
#include "backends/cuda/cuda_shmem.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/driver_api.h"
#include "backends/cuda/nccl_api.h"
#include "backends/host_function.h"

namespace cma {
namespace {

cudaStream_t AsStream(Stream s) { return reinterpret_cast<cudaStream_t>(s); }
cudaEvent_t AsEvent(Event e) { return reinterpret_cast<cudaEvent_t>(e); }

// Makes `device` current for the scope, restoring the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = previous_ == device ? absl::OkStatus()
                                  : CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// Relaxes this thread's stream-capture mode for its lifetime. Under a CUDA
// graph capture in global mode (torch.cuda.graph's default), a call that
// is not capturable (cudaMallocManaged, cudaStreamGetDevice) made on any
// thread fails and invalidates the capture, unless the calling thread has
// relaxed its mode: what PyTorch's own allocator does around cudaMalloc.
// Such calls are not captured; they simply run.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() : ok_(cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess) {}
  ~RelaxedCaptureMode() {
    if (ok_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_;
};

#define CMA_RETURN_IF_ERROR(expr)            \
  do {                                       \
    const absl::Status cma_s_ = (expr);      \
    if (!cma_s_.ok()) return cma_s_;         \
  } while (0)

#define CMA_CU_RETURN_IF_ERROR(expr)                            \
  do {                                                          \
    const CUresult cma_r_ = (expr);                             \
    if (cma_r_ != CUDA_SUCCESS) return ::cma::CuStatus(cma_r_, #expr); \
  } while (0)

#if CUDART_VERSION >= 13000
cudaMemLocation ToCuda(const Location& l) {
  cudaMemLocation loc{};
  loc.type = l.is_host() ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  loc.id = l.is_host() ? 0 : l.device;
  return loc;
}
#else
int ToCuda(const Location& l) { return l.is_host() ? cudaCpuDeviceId : l.device; }
#endif

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

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device_count, const DriverApi* cu) : device_count_(device_count), cu_(cu) {}
  ~CudaBackend() override {
    MutexLock l(&side_mu_);
    for (auto& [device, side] : side_) {
      if (side.stream != nullptr) cudaStreamDestroy(side.stream);
      if (side.before != nullptr) cudaEventDestroy(side.before);
      if (side.after != nullptr) cudaEventDestroy(side.after);
    }
  }

  const char* name() const override { return "cuda"; }

  absl::StatusOr<int> DeviceCount() override { return device_count_; }

  absl::Status CheckDevice(int device) const {
    if (device < 0 || device >= device_count_) {
      return absl::InvalidArgumentError(
          absl::StrFormat("invalid device %d: %d CUDA devices are visible", device, device_count_));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceFacts> GetDeviceFacts(int device) override {
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

  absl::StatusOr<MemInfo> GetMemInfo(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    DeviceGuard g(device);
    CMA_RETURN_IF_ERROR(g.status());
    MemInfo m;
    CMA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
    return m;
  }

  // ---- managed memory ----
  absl::StatusOr<void*> AllocateManaged(int device, std::size_t bytes) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    DeviceGuard g(device);
    CMA_RETURN_IF_ERROR(g.status());
    void* p = nullptr;
    RelaxedCaptureMode relaxed;
    CMA_CUDA_RETURN_IF_ERROR(cudaMallocManaged(&p, bytes, cudaMemAttachGlobal));
    return p;
  }

  absl::Status FreeManaged(void* ptr) override {
    CMA_CUDA_RETURN_IF_ERROR(cudaFree(ptr));
    return absl::OkStatus();
  }

  // ---- placement ----
  absl::Status Advise(void* ptr, std::size_t bytes, Advice advice, Location location) override {
    cudaMemoryAdvise a;
    switch (advice) {
      case Advice::kSetReadMostly: a = cudaMemAdviseSetReadMostly; break;
      case Advice::kUnsetReadMostly: a = cudaMemAdviseUnsetReadMostly; break;
      case Advice::kSetPreferredLocation: a = cudaMemAdviseSetPreferredLocation; break;
      case Advice::kUnsetPreferredLocation: a = cudaMemAdviseUnsetPreferredLocation; break;
      case Advice::kSetAccessedBy: a = cudaMemAdviseSetAccessedBy; break;
      case Advice::kUnsetAccessedBy: a = cudaMemAdviseUnsetAccessedBy; break;
      default:
        return absl::UnimplementedError(
            absl::StrCat("cudaMemAdvise: advice ", AdviceName(advice), " exists only on HIP"));
    }
    CMA_CUDA_RETURN_IF_ERROR(cudaMemAdvise(ptr, bytes, a, ToCuda(location)));
    return absl::OkStatus();
  }

  absl::Status Prefetch(void* ptr, std::size_t bytes, Location location, Stream stream) override {
#if CUDART_VERSION >= 13000
    CMA_CUDA_RETURN_IF_ERROR(
        cudaMemPrefetchAsync(ptr, bytes, ToCuda(location), 0, AsStream(stream)));
#else
    CMA_CUDA_RETURN_IF_ERROR(cudaMemPrefetchAsync(ptr, bytes, ToCuda(location), AsStream(stream)));
#endif
    return absl::OkStatus();
  }

  absl::Status PrefetchBatch(absl::Span<const Range> ranges, Location location,
                             Stream stream) override {
    if (ranges.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 13000
    if (ranges.size() > 1) {
      return Ordered(stream, [&](cudaStream_t s) {
        Batch b(ranges);
        cudaMemLocation loc = ToCuda(location);
        std::size_t first = 0;
        return CudaStatus(cudaMemPrefetchBatchAsync(b.ptrs.data(), b.sizes.data(), b.ptrs.size(),
                                                    &loc, &first, 1, 0, s),
                          "cudaMemPrefetchBatchAsync");
      });
    }
#endif
    for (const Range& r : ranges) CMA_RETURN_IF_ERROR(Prefetch(r.ptr, r.bytes, location, stream));
    return absl::OkStatus();
  }

  absl::Status DiscardBatch(absl::Span<const Range> ranges, Stream stream) override {
    if (ranges.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 13000
    return Ordered(stream, [&](cudaStream_t s) {
      Batch b(ranges);
      return CudaStatus(cudaMemDiscardBatchAsync(b.ptrs.data(), b.sizes.data(), b.ptrs.size(), 0, s),
                        "cudaMemDiscardBatchAsync");
    });
#else
    (void)stream;
    // Before CUDA 13 there is no discard: keeping the contents is a valid
    // outcome of "contents are dead", only slower on the next migration.
    return absl::OkStatus();
#endif
  }

  absl::Status DiscardAndPrefetchBatch(absl::Span<const Range> ranges, Location location,
                                       Stream stream) override {
    if (ranges.empty()) return absl::OkStatus();
#if CUDART_VERSION >= 13000
    return Ordered(stream, [&](cudaStream_t s) {
      Batch b(ranges);
      cudaMemLocation loc = ToCuda(location);
      std::size_t first = 0;
      return CudaStatus(cudaMemDiscardAndPrefetchBatchAsync(b.ptrs.data(), b.sizes.data(),
                                                            b.ptrs.size(), &loc, &first, 1, 0, s),
                        "cudaMemDiscardAndPrefetchBatchAsync");
    });
#else
    return PrefetchBatch(ranges, location, stream);
#endif
  }

  absl::StatusOr<RangeAttributes> GetRangeAttributes(void* ptr, std::size_t bytes) override {
    RangeAttributes a;
    int v = 0;
    CMA_CUDA_RETURN_IF_ERROR(
        cudaMemRangeGetAttribute(&v, sizeof(v), cudaMemRangeAttributeReadMostly, ptr, bytes));
    a.read_mostly = v != 0;
#if CUDART_VERSION >= 13000
    int type = 0, id = 0;
    CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
        &type, sizeof(type), cudaMemRangeAttributePreferredLocationType, ptr, bytes));
    CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
        &id, sizeof(id), cudaMemRangeAttributePreferredLocationId, ptr, bytes));
    a.has_preferred_location = type == cudaMemLocationTypeDevice || type == cudaMemLocationTypeHost;
    a.preferred_location = type == cudaMemLocationTypeHost ? Location::Host() : Location::Device(id);
    CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
        &type, sizeof(type), cudaMemRangeAttributeLastPrefetchLocationType, ptr, bytes));
    CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
        &id, sizeof(id), cudaMemRangeAttributeLastPrefetchLocationId, ptr, bytes));
    a.has_last_prefetch = type == cudaMemLocationTypeDevice || type == cudaMemLocationTypeHost;
    a.last_prefetch_location =
        type == cudaMemLocationTypeHost ? Location::Host() : Location::Device(id);
#else
    int loc = cudaInvalidDeviceId;
    CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
        &loc, sizeof(loc), cudaMemRangeAttributePreferredLocation, ptr, bytes));
    a.has_preferred_location = loc != cudaInvalidDeviceId;
    a.preferred_location = loc == cudaCpuDeviceId ? Location::Host() : Location::Device(loc);
    CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(
        &loc, sizeof(loc), cudaMemRangeAttributeLastPrefetchLocation, ptr, bytes));
    a.has_last_prefetch = loc != cudaInvalidDeviceId;
    a.last_prefetch_location = loc == cudaCpuDeviceId ? Location::Host() : Location::Device(loc);
#endif
    std::vector<int> by(device_count_ + 1, cudaInvalidDeviceId);
    CMA_CUDA_RETURN_IF_ERROR(cudaMemRangeGetAttribute(by.data(), by.size() * sizeof(int),
                                                      cudaMemRangeAttributeAccessedBy, ptr, bytes));
    for (int d : by) {
      if (d >= 0) a.accessed_by.push_back(d);
    }
    return a;
  }

  // ---- pinned host memory (backends/cuda/cuda_pinned.h) and copies (sleep staging) ----
  absl::StatusOr<void*> AllocatePinnedHost(std::size_t bytes) override {
    return pinned_.Allocate(bytes);
  }

  absl::Status FreePinnedHost(void* ptr) override { return pinned_.Free(ptr); }

  absl::Status PeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    return CudaPeerCopy(dst, src, bytes, stream);
  }
  absl::StatusOr<ShmemState> ShmemQueryState() override { return shmem_.QueryState(); }
  absl::StatusOr<std::string> ShmemUniqueId() override { return shmem_.UniqueId(); }
  absl::Status ShmemInit(const std::string& id, int pe, int n_pes, int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    return shmem_.Init(id, pe, n_pes, device);
  }
  absl::StatusOr<void*> ShmemMalloc(std::size_t bytes) override { return shmem_.Malloc(bytes); }
  absl::Status ShmemFree(void* ptr) override { return shmem_.Free(ptr); }
  absl::StatusOr<void*> ShmemPeerPointer(void* ptr, int pe) override {
    return shmem_.PeerPointer(ptr, pe);
  }
  absl::Status ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override {
    return shmem_.Put(dst, src, bytes, pe, stream);
  }
  absl::Status ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override {
    return shmem_.Get(dst, src, bytes, pe, stream);
  }
  absl::Status ShmemQuiet(Stream stream) override { return shmem_.Quiet(stream); }

  absl::Status CopyBatch(absl::Span<const Copy> copies, Stream stream) override {
    for (const Copy& c : copies) {
      CMA_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, AsStream(stream)));
    }
    return absl::OkStatus();
  }

  // ---- streams and events ----
  absl::StatusOr<Stream> CreateStream(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    DeviceGuard g(device);
    CMA_RETURN_IF_ERROR(g.status());
    cudaStream_t s;
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return reinterpret_cast<Stream>(s);
  }

  absl::Status DestroyStream(Stream stream) override {
    if (stream == kDefaultStream) {
      return absl::InvalidArgumentError("DestroyStream: the default stream cannot be destroyed");
    }
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamDestroy(AsStream(stream)));
    return absl::OkStatus();
  }

  absl::Status ValidateStream(int device, Stream stream) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    if (stream == kDefaultStream) return absl::OkStatus();
    // A stream first seen while it captures (PyTorch's side streams joined
    // to a graph): cudaStreamGetDevice is refused on it, in any capture
    // mode, and the refusal invalidates the capture. Asking whether it
    // captures is allowed and proves the handle is a live stream; its device
    // goes unchecked then (PyTorch hands only the current device's streams).
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(AsStream(stream), &capturing));
    if (capturing != cudaStreamCaptureStatusNone) return absl::OkStatus();
    int owner = -1;
    RelaxedCaptureMode relaxed;  // another thread's global capture forbids it too
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamGetDevice(AsStream(stream), &owner));
    if (owner != device) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "stream %p belongs to device %d, not device %d", AsStream(stream), owner, device));
    }
    return absl::OkStatus();
  }

  absl::Status SynchronizeStream(Stream stream) override {
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(AsStream(stream)));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryStream(Stream stream) override {
    const cudaError_t err = cudaStreamQuery(AsStream(stream));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaStatus(err, "cudaStreamQuery");
  }

  absl::Status LaunchHostFunction(Stream stream, HostFunction fn) override {
    void* data = NewHostFunction(std::move(fn));
    const cudaError_t err = cudaLaunchHostFunc(AsStream(stream), RunHostFunction, data);
    if (err != cudaSuccess) {
      DropHostFunction(data);
      return CudaStatus(err, "cudaLaunchHostFunc");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> IsCapturing(Stream stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(AsStream(stream), &status));
    return status != cudaStreamCaptureStatusNone;
  }

  // Graph topology for reuse inside a capture (backends/cuda/cuda_capture.h).
  absl::StatusOr<std::optional<CaptureFrontier>> CaptureFrontierOf(Stream stream) override {
    return CudaCaptureFrontier(AsStream(stream));
  }

  absl::StatusOr<std::vector<CaptureNode>> CaptureNodeDependencies(CaptureNode node) override {
    return CudaCaptureNodeDependencies(node);
  }

  absl::StatusOr<Event> CreateEvent(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    DeviceGuard g(device);
    CMA_RETURN_IF_ERROR(g.status());
    cudaEvent_t e;
    CMA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return reinterpret_cast<Event>(e);
  }

  absl::Status DestroyEvent(Event event) override {
    CMA_CUDA_RETURN_IF_ERROR(cudaEventDestroy(AsEvent(event)));
    return absl::OkStatus();
  }

  absl::Status RecordEvent(Event event, Stream stream) override {
    CMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(AsEvent(event), AsStream(stream)));
    return absl::OkStatus();
  }

  absl::StatusOr<bool> QueryEvent(Event event) override {
    const cudaError_t err = cudaEventQuery(AsEvent(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaStatus(err, "cudaEventQuery");
  }

  absl::Status SynchronizeEvent(Event event) override {
    CMA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(AsEvent(event)));
    return absl::OkStatus();
  }

  absl::Status StreamWaitEvent(Stream stream, Event event) override {
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(stream), AsEvent(event), 0));
    return absl::OkStatus();
  }

  // ---- VMM ----
  CUmemAllocationProp Prop(int device, HandleType type) const {
    CUmemAllocationProp p{};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = device;
    p.requestedHandleTypes = ToCu(type);
    return p;
  }

  absl::StatusOr<std::size_t> VmmGranularity(int device) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    CUmemAllocationProp p = Prop(device, HandleType::kPosixFd);
    std::size_t g = 0;
    CMA_CU_RETURN_IF_ERROR(
        cu_->cuMemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    return g;
  }

  absl::StatusOr<PhysicalHandle> VmmCreate(int device, std::size_t bytes,
                                           HandleType exportable) override {
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    DeviceGuard g(device);
    CMA_RETURN_IF_ERROR(g.status());
    CUmemAllocationProp p = Prop(device, exportable);
    CUmemGenericAllocationHandle h;
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemCreate(&h, bytes, &p, 0));
    return static_cast<PhysicalHandle>(h);
  }

  absl::Status VmmRelease(PhysicalHandle handle) override {
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemRelease(handle));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> VmmReserve(std::size_t bytes, std::size_t alignment) override {
    CUdeviceptr p = 0;
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemAddressReserve(&p, bytes, alignment, 0, 0));
    return reinterpret_cast<void*>(p);
  }

  absl::Status VmmFreeAddress(void* address, std::size_t bytes) override {
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemAddressFree(reinterpret_cast<CUdeviceptr>(address), bytes));
    return absl::OkStatus();
  }

  absl::Status VmmMap(void* address, std::size_t bytes, PhysicalHandle handle) override {
    CMA_CU_RETURN_IF_ERROR(
        cu_->cuMemMap(reinterpret_cast<CUdeviceptr>(address), bytes, 0, handle, 0));
    return absl::OkStatus();
  }

  absl::Status VmmUnmap(void* address, std::size_t bytes) override {
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemUnmap(reinterpret_cast<CUdeviceptr>(address), bytes));
    return absl::OkStatus();
  }

  absl::Status VmmSetAccess(void* address, std::size_t bytes,
                            absl::Span<const int> devices) override {
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

  absl::StatusOr<ShareableHandle> VmmExport(PhysicalHandle handle, HandleType type) override {
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

  absl::StatusOr<PhysicalHandle> VmmImport(const ShareableHandle& shared) override {
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
  absl::Status MulticastAllowed() const {
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

  absl::StatusOr<MulticastHandle> MulticastCreate(absl::Span<const int> devices,
                                                  std::size_t bytes) override {
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

  absl::Status MulticastAddDevice(MulticastHandle mc, int device) override {
    CMA_RETURN_IF_ERROR(MulticastAllowed());
    CMA_RETURN_IF_ERROR(CheckDevice(device));
    CUdevice dev;
    CMA_CU_RETURN_IF_ERROR(cu_->cuDeviceGet(&dev, device));
    CMA_CU_RETURN_IF_ERROR(cu_->cuMulticastAddDevice(mc, dev));
    return absl::OkStatus();
  }

  absl::Status MulticastBindMemory(MulticastHandle mc, std::size_t mc_offset, PhysicalHandle mem,
                                   std::size_t mem_offset, std::size_t bytes) override {
    CMA_RETURN_IF_ERROR(MulticastAllowed());
    CMA_CU_RETURN_IF_ERROR(cu_->cuMulticastBindMem(mc, mc_offset, mem, mem_offset, bytes, 0));
    return absl::OkStatus();
  }

  absl::Status MulticastRelease(MulticastHandle mc) override {
    CMA_CU_RETURN_IF_ERROR(cu_->cuMemRelease(mc));
    return absl::OkStatus();
  }

  absl::StatusOr<CommFacts> GetCommFacts(CommHandle comm) override {
    return NcclCommFacts(comm);
  }
  absl::StatusOr<CommWindow> RegisterCommWindow(CommHandle comm, void* ptr,
                                                std::size_t bytes) override {
    return NcclRegisterWindow(comm, ptr, bytes);
  }
  absl::Status DeregisterCommWindow(CommHandle comm, CommWindow window) override {
    return NcclDeregisterWindow(comm, window);
  }

 private:
  // The batch calls reject the legacy default stream. For it, `op` runs on a
  // private stream of the current device, fenced by events on both sides so
  // that it stays in the default stream's order.
  template <typename Op>
  absl::Status Ordered(Stream stream, Op&& op) {
    if (stream != kDefaultStream) return op(AsStream(stream));
    int device = 0;
    CMA_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
    MutexLock l(&side_mu_);
    SideStream& side = side_[device];
    if (side.stream == nullptr) {
      CMA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&side.stream, cudaStreamNonBlocking));
      CMA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&side.before, cudaEventDisableTiming));
      CMA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&side.after, cudaEventDisableTiming));
    }
    CMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.before, AsStream(stream)));
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(side.stream, side.before, 0));
    absl::Status s = op(side.stream);
    CMA_CUDA_RETURN_IF_ERROR(cudaEventRecord(side.after, side.stream));
    CMA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(AsStream(stream), side.after, 0));
    return s;
  }

  struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t before = nullptr;
    cudaEvent_t after = nullptr;
  };

  // Pointer and size arrays for the batch calls.
  struct Batch {
    explicit Batch(absl::Span<const Range> ranges) {
      ptrs.reserve(ranges.size());
      sizes.reserve(ranges.size());
      for (const Range& r : ranges) {
        ptrs.push_back(r.ptr);
        sizes.push_back(r.bytes);
      }
    }
    std::vector<void*> ptrs;
    std::vector<std::size_t> sizes;
  };

  const int device_count_;
  const DriverApi* const cu_;
  absl::Mutex side_mu_;
  absl::flat_hash_map<int, SideStream> side_ ABSL_GUARDED_BY(side_mu_);
  CudaPinnedHost pinned_;
  CudaShmem shmem_;
};

}  // namespace

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
  return std::unique_ptr<Backend>(new CudaBackend(count, *cu));
}

}  // namespace cma
