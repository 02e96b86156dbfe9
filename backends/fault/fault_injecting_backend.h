// FaultInjectingBackend: wraps any Backend and makes chosen calls fail, so
// that every error path of the allocator can be exercised.
//
// A fault plan says which calls fail: the Nth call of a kind (counting from
// 1), every call of a kind with probability p (seeded, reproducible), and/or
// events that report "not ready" for their first K queries (slow
// completion). Failures return the status a vendor backend would
// (kResourceExhausted for allocations, kInternal otherwise) and have no side
// effect: the wrapped backend is not called.
//
// Thread safety: as the wrapped backend; the plan and counters are guarded.
// Ownership: does not own the wrapped backend.
#ifndef CMA_BACKENDS_FAULT_FAULT_INJECTING_BACKEND_H_
#define CMA_BACKENDS_FAULT_FAULT_INJECTING_BACKEND_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"

namespace cma {

enum class FaultKind {
  kAny = 0,
  kAllocation,  // AllocateManaged, ReserveManaged, VmmCreate, AllocatePinnedHost
  kFree,        // FreeManaged, VmmRelease, FreePinnedHost
  kEventRecord,
  kEventQuery,  // QueryEvent, QueryStream, SynchronizeEvent
  kEventCreate,
  kStreamSync,
  kPrefetch,    // Prefetch, PrefetchBatch, DiscardAndPrefetchBatch
  kAdvise,
  kDiscard,
  kVmmMap,      // VmmReserve, VmmMap, VmmSetAccess
  kExport,      // VmmExport, VmmImport
  kOther,       // LaunchHostFunction and calls without a kind of their own
  kCopy,        // CopyBatch, PeerCopy, ShmemPut, ShmemGet
  kCommWindow,  // RegisterCommWindow
  // ShmemMalloc joins NVSHMEM's collective and gets memory, then reports
  // failure on this PE alone (NVSHMEM does not say it can; the memory stays
  // in its heap). Only a plan of this kind injects it, never kAny.
  kShmemOutcome,
  kCount,
};
const char* FaultKindName(FaultKind k);

struct FaultPlan {
  FaultKind kind = FaultKind::kAny;
  std::int64_t fail_nth = 0;       // 0: off; else the Nth call of `kind` fails (once)
  double probability = 0.0;        // every call of `kind` fails with this probability
  std::uint64_t seed = 1;
  int slow_event_queries = 0;      // each recorded event is "not ready" this many times,
                                   // and so are that many of every N+1 stream queries
};

class FaultInjectingBackend final : public Backend {
 public:
  explicit FaultInjectingBackend(Backend& inner) : inner_(inner) {}

  void SetPlan(const FaultPlan& plan);
  // Calls seen per kind since the last SetPlan, and faults injected.
  std::int64_t Calls(FaultKind k) const;
  std::int64_t Injected() const;

  const char* name() const override { return inner_.name(); }
  absl::StatusOr<int> DeviceCount() override;
  absl::StatusOr<DeviceFacts> GetDeviceFacts(int device) override;
  absl::StatusOr<MemInfo> GetMemInfo(int device) override;
  absl::StatusOr<MemInfo> GetHostMemInfo() override;
  absl::StatusOr<void*> AllocateManaged(int device, std::size_t bytes) override;
  absl::Status FreeManaged(void* ptr) override;
  absl::StatusOr<void*> ReserveManaged(int device, std::size_t bytes) override;
  absl::Status Advise(void* ptr, std::size_t bytes, Advice advice, Location location) override;
  absl::Status Prefetch(void* ptr, std::size_t bytes, Location location, Stream stream) override;
  absl::Status PrefetchBatch(absl::Span<const Range> ranges, Location location,
                             Stream stream) override;
  absl::Status DiscardBatch(absl::Span<const Range> ranges, Stream stream) override;
  absl::Status DiscardAndPrefetchBatch(absl::Span<const Range> ranges, Location location,
                                       Stream stream) override;
  absl::StatusOr<RangeAttributes> GetRangeAttributes(void* ptr, std::size_t bytes) override;
  absl::StatusOr<void*> AllocatePinnedHost(std::size_t bytes) override;
  absl::Status FreePinnedHost(void* ptr) override;
  absl::Status CopyBatch(absl::Span<const Copy> copies, Stream stream) override;
  absl::StatusOr<Stream> CreateStream(int device) override;
  absl::Status DestroyStream(Stream stream) override;
  absl::Status ValidateStream(int device, Stream stream) override;
  absl::Status SynchronizeStream(Stream stream) override;
  absl::StatusOr<bool> QueryStream(Stream stream) override;
  absl::Status LaunchHostFunction(Stream stream, absl::AnyInvocable<void() &&> fn) override;
  absl::StatusOr<bool> IsCapturing(Stream stream) override { return inner_.IsCapturing(stream); }
  absl::StatusOr<std::optional<CaptureFrontier>> CaptureFrontierOf(Stream stream) override {
    return inner_.CaptureFrontierOf(stream);
  }
  absl::StatusOr<std::vector<CaptureNode>> CaptureNodeDependencies(CaptureNode node) override {
    return inner_.CaptureNodeDependencies(node);
  }
  absl::StatusOr<Event> CreateEvent(int device) override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;
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
  // PeerCopy, ShmemPut and ShmemGet fail as kCopy. The NVSHMEM collectives
  // (ShmemInit, ShmemMalloc, ShmemFree) and queries are always joined: a PE
  // that failed one alone, without joining it, would leave the others
  // waiting inside NVSHMEM, which no real failure does. ShmemMalloc may
  // report failure after joining (kShmemOutcome).
  absl::Status PeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  absl::StatusOr<ShmemState> ShmemQueryState() override { return inner_.ShmemQueryState(); }
  absl::StatusOr<std::string> ShmemUniqueId() override { return inner_.ShmemUniqueId(); }
  absl::Status ShmemInit(const std::string& unique_id, int pe, int n_pes, int device) override {
    return inner_.ShmemInit(unique_id, pe, n_pes, device);
  }
  absl::StatusOr<void*> ShmemMalloc(std::size_t bytes) override;
  absl::Status ShmemFree(void* ptr) override { return inner_.ShmemFree(ptr); }
  absl::StatusOr<void*> ShmemPeerPointer(void* ptr, int pe) override {
    return inner_.ShmemPeerPointer(ptr, pe);
  }
  absl::Status ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override;
  absl::Status ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override;
  absl::Status ShmemQuiet(Stream stream) override { return inner_.ShmemQuiet(stream); }

 private:
  // Counts the call; returns the injected failure, or OK to go ahead.
  absl::Status Maybe(FaultKind kind, const char* call) ABSL_LOCKS_EXCLUDED(mu_);

  Backend& inner_;
  mutable absl::Mutex mu_;
  FaultPlan plan_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::int64_t calls_[static_cast<int>(FaultKind::kCount)] ABSL_GUARDED_BY(mu_) = {};
  std::int64_t injected_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<Event, int> slow_ ABSL_GUARDED_BY(mu_);  // queries left "not ready"
  absl::flat_hash_map<Stream, unsigned> slow_streams_ ABSL_GUARDED_BY(mu_);  // queries so far
};

}  // namespace cma

#endif  // CMA_BACKENDS_FAULT_FAULT_INJECTING_BACKEND_H_
