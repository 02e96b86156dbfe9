// The CUDA backend's internal declarations, shared by its files
// (backends/cuda/): the CudaBackend class and the helpers its parts use.
// cuda_backend.cc holds its lifetime, device facts and the forwarders to
// pinned memory, NVSHMEM and NCCL; cuda_managed.cc managed memory, placement
// and copies; cuda_streams.cc streams, events and capture; cuda_vmm.cc VMM
// and multicast. Not for use outside backends/cuda/: MakeCudaBackend
// (cuda_backend.h) is the interface.
#ifndef CMA_BACKENDS_CUDA_CUDA_BACKEND_INTERNAL_H_
#define CMA_BACKENDS_CUDA_CUDA_BACKEND_INTERNAL_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/cuda/cuda_pinned.h"
#include "backends/cuda/cuda_shmem.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/driver_api.h"
#include "backends/host_function.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace cuda_internal {

inline cudaStream_t AsStream(Stream s) { return reinterpret_cast<cudaStream_t>(s); }
inline cudaEvent_t AsEvent(Event e) { return reinterpret_cast<cudaEvent_t>(e); }

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

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device_count, const DriverApi* cu) : device_count_(device_count), cu_(cu) {}
  ~CudaBackend() override;
  const char* name() const override { return "cuda"; }
  absl::StatusOr<int> DeviceCount() override { return device_count_; }
  absl::Status CheckDevice(int device) const;
  absl::StatusOr<DeviceFacts> GetDeviceFacts(int device) override;
  absl::StatusOr<MemInfo> GetMemInfo(int device) override;

  // ---- managed memory ----
  absl::StatusOr<void*> AllocateManaged(int device, std::size_t bytes) override;
  absl::Status FreeManaged(void* ptr) override;

  // ---- placement ----
  absl::Status Advise(void* ptr, std::size_t bytes, Advice advice, Location location) override;
  absl::Status Prefetch(void* ptr, std::size_t bytes, Location location, Stream stream) override;
  absl::Status PrefetchBatch(absl::Span<const Range> ranges, Location location,
                             Stream stream) override;
  absl::Status DiscardBatch(absl::Span<const Range> ranges, Stream stream) override;
  absl::Status DiscardAndPrefetchBatch(absl::Span<const Range> ranges, Location location,
                                       Stream stream) override;
  absl::StatusOr<RangeAttributes> GetRangeAttributes(void* ptr, std::size_t bytes) override;

  // ---- pinned host memory (backends/cuda/cuda_pinned.h) and copies (sleep staging) ----
  absl::StatusOr<void*> AllocatePinnedHost(std::size_t bytes) override;
  absl::Status FreePinnedHost(void* ptr) override;
  absl::Status PeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  absl::StatusOr<ShmemState> ShmemQueryState() override;
  absl::StatusOr<std::string> ShmemUniqueId() override;
  absl::Status ShmemInit(const std::string& id, int pe, int n_pes, int device) override;
  absl::StatusOr<void*> ShmemMalloc(std::size_t bytes) override;
  absl::Status ShmemFree(void* ptr) override;
  absl::StatusOr<void*> ShmemPeerPointer(void* ptr, int pe) override;
  absl::Status ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override;
  absl::Status ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override;
  absl::Status ShmemQuiet(Stream stream) override;
  absl::Status CopyBatch(absl::Span<const Copy> copies, Stream stream) override;

  // ---- streams and events ----
  absl::StatusOr<Stream> CreateStream(int device) override;
  absl::Status DestroyStream(Stream stream) override;
  absl::Status ValidateStream(int device, Stream stream) override;
  absl::Status SynchronizeStream(Stream stream) override;
  absl::StatusOr<bool> QueryStream(Stream stream) override;
  absl::Status LaunchHostFunction(Stream stream, HostFunction fn) override;
  absl::StatusOr<bool> IsCapturing(Stream stream) override;

  // Graph topology for reuse inside a capture (backends/cuda/cuda_capture.h).
  absl::StatusOr<std::optional<CaptureFrontier>> CaptureFrontierOf(Stream stream) override;
  absl::StatusOr<std::vector<CaptureNode>> CaptureNodeDependencies(CaptureNode node) override;
  absl::StatusOr<Event> CreateEvent(int device) override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;

  // ---- VMM ----
  CUmemAllocationProp Prop(int device, HandleType type) const;
  absl::StatusOr<std::size_t> VmmGranularity(int device) override;
  absl::StatusOr<PhysicalHandle> VmmCreate(int device, std::size_t bytes,
                                           HandleType exportable) override;
  absl::Status VmmRelease(PhysicalHandle handle) override;
  absl::StatusOr<void*> VmmReserve(std::size_t bytes, std::size_t alignment) override;
  absl::Status VmmFreeAddress(void* address, std::size_t bytes) override;
  absl::Status VmmMap(void* address, std::size_t bytes, PhysicalHandle handle) override;
  absl::Status VmmUnmap(void* address, std::size_t bytes) override;
  absl::Status VmmSetAccess(void* address, std::size_t bytes,
                            absl::Span<const int> devices) override;
  absl::StatusOr<ShareableHandle> VmmExport(PhysicalHandle handle, HandleType type) override;
  absl::StatusOr<PhysicalHandle> VmmImport(const ShareableHandle& shared) override;

  // ---- multicast: guarded; never exercised on shared machines ----
  absl::Status MulticastAllowed() const;
  absl::StatusOr<MulticastHandle> MulticastCreate(absl::Span<const int> devices,
                                                  std::size_t bytes) override;
  absl::Status MulticastAddDevice(MulticastHandle mc, int device) override;
  absl::Status MulticastBindMemory(MulticastHandle mc, std::size_t mc_offset, PhysicalHandle mem,
                                   std::size_t mem_offset, std::size_t bytes) override;
  absl::Status MulticastRelease(MulticastHandle mc) override;
  absl::StatusOr<CommFacts> GetCommFacts(CommHandle comm) override;
  absl::StatusOr<CommWindow> RegisterCommWindow(CommHandle comm, void* ptr,
                                                std::size_t bytes) override;
  absl::Status DeregisterCommWindow(CommHandle comm, CommWindow window) override;

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

}  // namespace cuda_internal
}  // namespace cma

#endif  // CMA_BACKENDS_CUDA_CUDA_BACKEND_INTERNAL_H_
