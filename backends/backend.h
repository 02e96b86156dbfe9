// The one interface through which the allocator reaches a vendor runtime.
//
// A Backend wraps managed memory, placement (advise/prefetch/discard), streams
// and events, the virtual memory management (VMM) API used by the symmetric
// mode, and device facts. Implementations: backends/host (CPU emulation, always
// built), backends/cuda and backends/hip (built where their toolkits exist).
//
// Contract:
//  * Thread safety: every method may be called concurrently from any thread.
//  * Errors: every failure is an absl::Status naming the call and, for vendor
//    backends, the vendor's error string. Out-of-memory is kResourceExhausted;
//    bad handles or arguments are kInvalidArgument. A failed call leaves no
//    resource behind.
//  * Ownership: handles returned by Create*/Allocate*/Reserve belong to the
//    caller, who must release them with the matching Destroy/Free/Release.
//  * Streams and events are opaque integers: a vendor backend stores its
//    native handle (cudaStream_t, hipEvent_t) in them. Stream 0 is each
//    device's default (legacy) stream.
#ifndef CMA_BACKENDS_BACKEND_H_
#define CMA_BACKENDS_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace cma {

using Stream = std::uintptr_t;
using Event = std::uintptr_t;
inline constexpr Stream kDefaultStream = 0;

// A node of a CUDA graph being captured (cudaGraphNode_t), opaque.
using CaptureNode = std::uintptr_t;
// A capturing stream's place in its graph: the capture (unique per capture
// sequence) and the nodes the next work captured on the stream will depend
// on (none at the capture's start).
struct CaptureFrontier {
  std::uint64_t capture = 0;
  std::vector<CaptureNode> nodes;
};

// Where managed memory should live: one device, or the host.
struct Location {
  enum class Kind { kDevice, kHost };
  Kind kind = Kind::kDevice;
  int device = 0;  // meaningful only for kDevice

  static Location Host() { return {Kind::kHost, -1}; }
  static Location Device(int d) { return {Kind::kDevice, d}; }
  bool is_host() const { return kind == Kind::kHost; }
  friend bool operator==(const Location& a, const Location& b) {
    return a.kind == b.kind && (a.kind == Kind::kHost || a.device == b.device);
  }
  friend bool operator!=(const Location& a, const Location& b) { return !(a == b); }
};
std::string LocationName(const Location& l);

// Managed-memory advice, as cudaMemAdvise/hipMemAdvise take it.
enum class Advice {
  kSetReadMostly,
  kUnsetReadMostly,
  kSetPreferredLocation,
  kUnsetPreferredLocation,
  kSetAccessedBy,
  kUnsetAccessedBy,
  kSetCoarseGrain,  // HIP only; other backends report Unimplemented
  kUnsetCoarseGrain,
};
const char* AdviceName(Advice a);

struct Range {
  void* ptr = nullptr;
  std::size_t bytes = 0;
};

// One stream-ordered copy of `bytes` from `src` to `dst` (CopyBatch).
struct Copy {
  void* dst = nullptr;
  const void* src = nullptr;
  std::size_t bytes = 0;
};

// What a backend can report about a managed range (cudaMemRangeGetAttribute).
struct RangeAttributes {
  bool read_mostly = false;
  bool has_preferred_location = false;
  Location preferred_location;
  bool has_last_prefetch = false;
  Location last_prefetch_location;
  std::vector<int> accessed_by;  // devices
};

struct MemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
};

struct DeviceFacts {
  std::string name;
  std::size_t total_bytes = 0;
  bool concurrent_managed_access = false;  // GPU may touch managed memory while the CPU does
  bool pageable_memory_access = false;     // GPU may touch plain malloc'ed memory
  bool page_fault_migration = false;       // managed memory migrates on fault (HIP: XNACK)
  bool vmm_supported = false;
  bool posix_fd_handles = false;
  bool fabric_handles = false;
  // The NVLink domain this device's fabric handles reach (other hosts'
  // devices with the same domain can import them); empty when the backend
  // does not know it (CUDA today), in which case a symmetric heap does not
  // send fabric handles to other hosts.
  std::string fabric_domain;
  bool multicast_supported = false;
  std::size_t vmm_granularity = 0;  // minimum; 0 when VMM is unsupported
  // The vendor runtime in use, e.g. "CUDA runtime 13000, driver 13000" or
  // "HIP 50221153 (/opt/rocm/lib/libamdhip64.so)"; for results and reports.
  std::string runtime;
  // HIP only: XNACK as the runtime reports it in effect ("on", "off", or
  // "absent" when the target has no such feature); empty elsewhere.
  std::string xnack;
  // Why page_fault_migration is what it is, where the backend knows (HIP);
  // allocator errors quote it when a policy needs migration on fault.
  std::string managed_memory_note;
};

// Shareable VMM handle kinds.
enum class HandleType { kPosixFd, kFabric };

// A physical VMM allocation (CUmemGenericAllocationHandle, memfd, ...).
using PhysicalHandle = std::uint64_t;
using MulticastHandle = std::uint64_t;

// A communicator of a collective library (NCCL's ncclComm_t), opaque to cma:
// the framework owns it and must keep it alive while windows use it.
using CommHandle = std::uintptr_t;
// A window registered on a communicator (NCCL's ncclWindow_t); 0 when the
// library registered nothing (it reports windows unsupported there).
using CommWindow = std::uintptr_t;

// What a communicator says about this member.
struct CommFacts {
  int rank = 0;
  int size = 0;
  int device = 0;
};

// A handle that can travel to another process: a POSIX file descriptor
// (passed with SCM_RIGHTS) or a 64-byte fabric handle.
struct ShareableHandle {
  HandleType type = HandleType::kPosixFd;
  int fd = -1;
  unsigned char fabric[64] = {};
  std::size_t bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "host", "cuda" or "hip".
  virtual const char* name() const = 0;

  // ---- device facts ----
  virtual absl::StatusOr<int> DeviceCount() = 0;
  virtual absl::StatusOr<DeviceFacts> GetDeviceFacts(int device) = 0;
  virtual absl::StatusOr<MemInfo> GetMemInfo(int device) = 0;
  // The host's memory: available (Linux's MemAvailable) and total. The
  // default reads /proc/meminfo; kUnavailable where it cannot.
  virtual absl::StatusOr<MemInfo> GetHostMemInfo();

  // ---- managed memory ----
  // Allocates `bytes` of managed memory whose home is `device` (the device
  // used to count capacity; the memory itself may migrate anywhere).
  virtual absl::StatusOr<void*> AllocateManaged(int device, std::size_t bytes) = 0;
  virtual absl::Status FreeManaged(void* ptr) = 0;
  // Managed address space whose pages are populated only when placed or
  // touched (an arena). On CUDA and HIP this is the same call as
  // AllocateManaged, which populates nothing either; the host backend
  // charges its emulated device for populated pages only. Freed with
  // FreeManaged.
  virtual absl::StatusOr<void*> ReserveManaged(int device, std::size_t bytes) {
    return AllocateManaged(device, bytes);
  }

  // ---- placement ----
  virtual absl::Status Advise(void* ptr, std::size_t bytes, Advice advice,
                              Location location) = 0;
  virtual absl::Status Prefetch(void* ptr, std::size_t bytes, Location location,
                                Stream stream) = 0;
  // Batch forms. Backends without the batch call loop over the ranges.
  virtual absl::Status PrefetchBatch(absl::Span<const Range> ranges, Location location,
                                     Stream stream) = 0;
  // Marks ranges' contents dead: the next access may see any value and no
  // data is migrated for them.
  virtual absl::Status DiscardBatch(absl::Span<const Range> ranges, Stream stream) = 0;
  virtual absl::Status DiscardAndPrefetchBatch(absl::Span<const Range> ranges,
                                               Location location, Stream stream) = 0;
  virtual absl::StatusOr<RangeAttributes> GetRangeAttributes(void* ptr,
                                                             std::size_t bytes) = 0;

  // ---- pinned host memory and copies (sleep staging) ----
  // Page-locked host memory the copy engines reach at full link speed
  // (cudaHostAlloc). Backends without it report kUnimplemented, and the
  // allocator then sleeps by migrating pages instead. Freeing waits for the
  // copies queued on it (cudaFreeHost synchronises).
  virtual absl::StatusOr<void*> AllocatePinnedHost(std::size_t bytes) {
    return absl::UnimplementedError("pinned host memory is not supported by this backend");
  }
  virtual absl::Status FreePinnedHost(void* ptr) {
    return absl::UnimplementedError("pinned host memory is not supported by this backend");
  }
  // Copies between managed memory (wherever its pages are) and pinned host
  // memory, in `stream`'s order, one call per copy or one batch. A copy into
  // unpopulated managed pages populates them on `stream`'s device; callers
  // place them first.
  virtual absl::Status CopyBatch(absl::Span<const Copy> copies, Stream stream) {
    return absl::UnimplementedError("stream-ordered copies are not supported by this backend");
  }

  // ---- streams and events ----
  virtual absl::StatusOr<Stream> CreateStream(int device) = 0;
  virtual absl::Status DestroyStream(Stream stream) = 0;
  // OK when `stream` is a live stream usable on `device` (the default stream
  // is valid on every device); kInvalidArgument otherwise.
  virtual absl::Status ValidateStream(int device, Stream stream) = 0;
  virtual absl::Status SynchronizeStream(Stream stream) = 0;
  // true when all work queued on `stream` so far has completed: one call,
  // where recording and querying an event would take two.
  virtual absl::StatusOr<bool> QueryStream(Stream stream) = 0;
  // Runs `fn` once on a thread of the backend's after the work queued on
  // `stream` before it has completed; work queued after it waits for it
  // (cudaLaunchHostFunc). `fn` must not call the backend (the runtimes
  // forbid it) and should be short: it holds up the stream. kUnimplemented
  // where the backend has no such call; `fn` is then dropped unrun.
  virtual absl::Status LaunchHostFunction(Stream stream, absl::AnyInvocable<void() &&> fn) {
    return absl::UnimplementedError("host functions in stream order are not supported by this "
                                    "backend");
  }
  // true while `stream` is being captured into a graph (CUDA graphs); the
  // host backend and backends without graphs never capture.
  virtual absl::StatusOr<bool> IsCapturing(Stream stream) { return false; }
  // Where the graph a capturing stream records stands (nullopt when `stream`
  // is not capturing, or the backend cannot tell: a block freed during a
  // capture then waits for the capture's end). Legal during a capture.
  virtual absl::StatusOr<std::optional<CaptureFrontier>> CaptureFrontierOf(Stream stream) {
    return std::nullopt;
  }
  // The nodes `node` (of a graph being captured) depends on directly.
  virtual absl::StatusOr<std::vector<CaptureNode>> CaptureNodeDependencies(CaptureNode node) {
    return absl::UnimplementedError("CaptureNodeDependencies: this backend has no graphs");
  }
  virtual absl::StatusOr<Event> CreateEvent(int device) = 0;
  virtual absl::Status DestroyEvent(Event event) = 0;
  virtual absl::Status RecordEvent(Event event, Stream stream) = 0;
  // true when all work captured by the event has completed.
  virtual absl::StatusOr<bool> QueryEvent(Event event) = 0;
  virtual absl::Status SynchronizeEvent(Event event) = 0;
  virtual absl::Status StreamWaitEvent(Stream stream, Event event) = 0;
  // ---- virtual memory management (symmetric mode) ----
  virtual absl::StatusOr<std::size_t> VmmGranularity(int device) = 0;
  virtual absl::StatusOr<PhysicalHandle> VmmCreate(int device, std::size_t bytes,
                                                   HandleType exportable) = 0;
  virtual absl::Status VmmRelease(PhysicalHandle handle) = 0;
  virtual absl::StatusOr<void*> VmmReserve(std::size_t bytes, std::size_t alignment) = 0;
  virtual absl::Status VmmFreeAddress(void* address, std::size_t bytes) = 0;
  virtual absl::Status VmmMap(void* address, std::size_t bytes, PhysicalHandle handle) = 0;
  virtual absl::Status VmmUnmap(void* address, std::size_t bytes) = 0;
  // One call granting read/write to every listed device.
  virtual absl::Status VmmSetAccess(void* address, std::size_t bytes,
                                    absl::Span<const int> devices) = 0;
  // The caller owns the returned FD (close it) or fabric bytes.
  virtual absl::StatusOr<ShareableHandle> VmmExport(PhysicalHandle handle,
                                                    HandleType type) = 0;
  // Does not take ownership of `shared.fd`.
  virtual absl::StatusOr<PhysicalHandle> VmmImport(const ShareableHandle& shared) = 0;

  // ---- multicast (guarded opt-in; never exercised on shared GPU machines) ----
  virtual absl::StatusOr<MulticastHandle> MulticastCreate(absl::Span<const int> devices,
                                                          std::size_t bytes) = 0;
  virtual absl::Status MulticastAddDevice(MulticastHandle mc, int device) = 0;
  virtual absl::Status MulticastBindMemory(MulticastHandle mc, std::size_t mc_offset,
                                           PhysicalHandle mem, std::size_t mem_offset,
                                           std::size_t bytes) = 0;
  virtual absl::Status MulticastRelease(MulticastHandle mc) = 0;

  // ---- communicator windows (NCCL's symmetric windows) ----
  // The library is loaded at run time; a backend without one returns
  // kUnimplemented naming it. GetCommFacts reads the communicator.
  virtual absl::StatusOr<CommFacts> GetCommFacts(CommHandle comm);
  // Collective over every member of `comm` (each registers its own buffer,
  // all of the same size): [ptr, ptr + bytes) must lie in one VMM physical
  // allocation mapped by this process, at an offset aligned to 4096, and
  // becomes a window that the library's symmetric collectives use.
  virtual absl::StatusOr<CommWindow> RegisterCommWindow(CommHandle comm, void* ptr,
                                                        std::size_t bytes) {
    return GetCommFacts(comm).status();
  }
  // Local (NCCL's deregistration makes no exchange): the library drops its
  // mapping of this member's memory; `comm` must still be alive.
  virtual absl::Status DeregisterCommWindow(CommHandle comm, CommWindow window) {
    return GetCommFacts(comm).status();
  }

  // ---- a stream-ordered copy between device buffers mapped here ----
  // Copies `bytes` from `src` to `dst`, both device memory this process can
  // address (a symmetric buffer, a peer's mapping of one, managed memory),
  // in `stream`'s order (cudaMemcpyAsync). kUnimplemented where the backend
  // has no such call.
  virtual absl::Status PeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) {
    return absl::UnimplementedError(
        std::string("PeerCopy: stream-ordered device copies are not supported by the ") + name() +
        " backend");
  }

  // ---- an NVSHMEM symmetric heap (the symmetric heap's second provider) ----
  // One processing element (PE) per process, one device per PE. The CUDA
  // backend loads NVSHMEM's host library at run time (CMA_NVSHMEM_LIBRARY,
  // else libnvshmem_host.so.3); the host backend emulates it across
  // processes. Every backend without it answers kUnimplemented, naming itself.
  // ShmemInit, ShmemMalloc and ShmemFree are collective over every PE and
  // block until all PEs have made the same call: callers agree (through
  // their own exchange) before they make one, so that no PE waits inside
  // for one that will never come. They are not failed by fault injection
  // alone for that reason (a PE that does not join is a hang, not an error).
  //
  // Where this process stands: whether NVSHMEM is initialised, and as which
  // PE of how many. Cheap; any time.
  struct ShmemState {
    bool initialized = false;
    int pe = -1;
    int n_pes = 0;
  };
  virtual absl::StatusOr<ShmemState> ShmemQueryState() { return ShmemUnimplemented("ShmemQueryState"); }
  // A fresh unique id (NVSHMEM's nvshmemx_uniqueid_t, 128 bytes) for PE 0
  // to hand to every PE; it names PE 0's bootstrap and is secret only as far
  // as the channel that carries it is.
  virtual absl::StatusOr<std::string> ShmemUniqueId() { return ShmemUnimplemented("ShmemUniqueId"); }
  // Collective: this process becomes PE `pe` of `n_pes` on `device`, all
  // PEs with the same id. Once per process: kFailedPrecondition when
  // already initialised.
  virtual absl::Status ShmemInit(const std::string& unique_id, int pe, int n_pes, int device) {
    return ShmemUnimplemented("ShmemInit");
  }
  // Collective: `bytes` of the symmetric heap, at the same offset on every
  // PE (the local address is also the name of every PE's copy); every PE
  // passes the same size. kResourceExhausted when the heap is full.
  virtual absl::StatusOr<void*> ShmemMalloc(std::size_t bytes) { return ShmemUnimplemented("ShmemMalloc"); }
  // Collective: every PE frees the same allocation, in the same order.
  virtual absl::Status ShmemFree(void* ptr) { return ShmemUnimplemented("ShmemFree"); }
  // PE `pe`'s copy of the symmetric object at local address `ptr`, as an
  // address this process can load from and store to (nvshmem_ptr); nullptr
  // when that PE is not reachable by load/store (ShmemPut/ShmemGet are).
  virtual absl::StatusOr<void*> ShmemPeerPointer(void* ptr, int pe) {
    return ShmemUnimplemented("ShmemPeerPointer");
  }
  // `bytes` from local memory `src` into PE `pe`'s copy of the symmetric
  // object at local address `dst`, in `stream`'s order; and the reverse.
  // Delivered once ShmemQuiet, queued after them on the stream, is reached.
  virtual absl::Status ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                                Stream stream) {
    return ShmemUnimplemented("ShmemPut");
  }
  virtual absl::Status ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                                Stream stream) {
    return ShmemUnimplemented("ShmemGet");
  }
  virtual absl::Status ShmemQuiet(Stream stream) { return ShmemUnimplemented("ShmemQuiet"); }

 private:
  absl::Status ShmemUnimplemented(const char* call) const {
    return absl::UnimplementedError(std::string(call) + ": the " + name() +
                                    " backend has no NVSHMEM symmetric heap");
  }
};

}  // namespace cma

#endif  // CMA_BACKENDS_BACKEND_H_
