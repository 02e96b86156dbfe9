#include "backends/mutex_lock.h"
#include "backends/fault/fault_injecting_backend.h"

#include "absl/strings/str_cat.h"

namespace cma {

const char* FaultKindName(FaultKind k) {
  static constexpr const char* kNames[] = {
      "any",   "allocation", "free",    "event_record", "event_query", "event_create", "stream_sync",
      "prefetch", "advise",  "discard", "vmm_map",      "export",      "other", "copy",
      "comm_window", "shmem_outcome"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<int>(FaultKind::kCount));
  const int i = static_cast<int>(k);
  return i >= 0 && i < static_cast<int>(FaultKind::kCount) ? kNames[i] : "?";
}

void FaultInjectingBackend::SetPlan(const FaultPlan& plan) {
  MutexLock l(&mu_);
  plan_ = plan;
  rng_.seed(plan.seed);
  for (auto& c : calls_) c = 0;
  injected_ = 0;
  slow_.clear();
}

std::int64_t FaultInjectingBackend::Calls(FaultKind k) const {
  MutexLock l(&mu_);
  return calls_[static_cast<int>(k)];
}

std::int64_t FaultInjectingBackend::Injected() const {
  MutexLock l(&mu_);
  return injected_;
}

absl::Status FaultInjectingBackend::Maybe(FaultKind kind, const char* call) {
  MutexLock l(&mu_);
  const std::int64_t n_kind = ++calls_[static_cast<int>(kind)];
  // A mixed NVSHMEM outcome is only ever planned by its kind: kAny plans
  // neither count nor inject it.
  const bool any_may = kind != FaultKind::kShmemOutcome;
  std::int64_t& any_calls = calls_[static_cast<int>(FaultKind::kAny)];
  const std::int64_t n_any = any_may ? ++any_calls : any_calls;
  if (plan_.kind != FaultKind::kAny && plan_.kind != kind) return absl::OkStatus();
  if (plan_.kind == FaultKind::kAny && !any_may) return absl::OkStatus();
  const std::int64_t n = plan_.kind == FaultKind::kAny ? n_any : n_kind;
  bool fail = plan_.fail_nth > 0 && n == plan_.fail_nth;
  if (!fail && plan_.probability > 0) {
    fail = std::uniform_real_distribution<double>(0, 1)(rng_) < plan_.probability;
  }
  if (!fail) return absl::OkStatus();
  ++injected_;
  const std::string msg = absl::StrCat(call, " failed: injected fault (", FaultKindName(kind),
                                       " call ", n_kind, ")");
  return kind == FaultKind::kAllocation ? absl::ResourceExhaustedError(msg)
                                        : absl::InternalError(msg);
}

#define CMA_FAULT(kind, call)                                  \
  do {                                                         \
    absl::Status cma_f_ = Maybe(FaultKind::kind, call);        \
    if (!cma_f_.ok()) return cma_f_;                           \
  } while (0)

absl::StatusOr<int> FaultInjectingBackend::DeviceCount() { return inner_.DeviceCount(); }
absl::StatusOr<DeviceFacts> FaultInjectingBackend::GetDeviceFacts(int device) {
  return inner_.GetDeviceFacts(device);
}
absl::StatusOr<MemInfo> FaultInjectingBackend::GetMemInfo(int device) {
  CMA_FAULT(kOther, "GetMemInfo");
  return inner_.GetMemInfo(device);
}
absl::StatusOr<MemInfo> FaultInjectingBackend::GetHostMemInfo() {
  CMA_FAULT(kOther, "GetHostMemInfo");
  return inner_.GetHostMemInfo();
}
absl::StatusOr<void*> FaultInjectingBackend::AllocateManaged(int device, std::size_t bytes) {
  CMA_FAULT(kAllocation, "AllocateManaged");
  return inner_.AllocateManaged(device, bytes);
}
absl::StatusOr<void*> FaultInjectingBackend::ReserveManaged(int device, std::size_t bytes) {
  CMA_FAULT(kAllocation, "ReserveManaged");
  return inner_.ReserveManaged(device, bytes);
}
absl::Status FaultInjectingBackend::FreeManaged(void* ptr) {
  CMA_FAULT(kFree, "FreeManaged");
  return inner_.FreeManaged(ptr);
}
absl::Status FaultInjectingBackend::Advise(void* ptr, std::size_t bytes, Advice advice,
                                           Location location) {
  CMA_FAULT(kAdvise, "Advise");
  return inner_.Advise(ptr, bytes, advice, location);
}
absl::Status FaultInjectingBackend::Prefetch(void* ptr, std::size_t bytes, Location location,
                                             Stream stream) {
  CMA_FAULT(kPrefetch, "Prefetch");
  return inner_.Prefetch(ptr, bytes, location, stream);
}
absl::Status FaultInjectingBackend::PrefetchBatch(absl::Span<const Range> ranges,
                                                  Location location, Stream stream) {
  CMA_FAULT(kPrefetch, "PrefetchBatch");
  return inner_.PrefetchBatch(ranges, location, stream);
}
absl::Status FaultInjectingBackend::DiscardBatch(absl::Span<const Range> ranges, Stream stream) {
  CMA_FAULT(kDiscard, "DiscardBatch");
  return inner_.DiscardBatch(ranges, stream);
}
absl::Status FaultInjectingBackend::DiscardAndPrefetchBatch(absl::Span<const Range> ranges,
                                                            Location location, Stream stream) {
  CMA_FAULT(kPrefetch, "DiscardAndPrefetchBatch");
  return inner_.DiscardAndPrefetchBatch(ranges, location, stream);
}
absl::StatusOr<RangeAttributes> FaultInjectingBackend::GetRangeAttributes(void* ptr,
                                                                          std::size_t bytes) {
  CMA_FAULT(kOther, "GetRangeAttributes");
  return inner_.GetRangeAttributes(ptr, bytes);
}
absl::StatusOr<void*> FaultInjectingBackend::AllocatePinnedHost(std::size_t bytes) {
  CMA_FAULT(kAllocation, "AllocatePinnedHost");
  return inner_.AllocatePinnedHost(bytes);
}
absl::Status FaultInjectingBackend::FreePinnedHost(void* ptr) {
  CMA_FAULT(kFree, "FreePinnedHost");
  return inner_.FreePinnedHost(ptr);
}
absl::Status FaultInjectingBackend::CopyBatch(absl::Span<const Copy> copies, Stream stream) {
  CMA_FAULT(kCopy, "CopyBatch");
  return inner_.CopyBatch(copies, stream);
}
absl::StatusOr<Stream> FaultInjectingBackend::CreateStream(int device) {
  CMA_FAULT(kOther, "CreateStream");
  return inner_.CreateStream(device);
}
absl::Status FaultInjectingBackend::DestroyStream(Stream stream) {
  return inner_.DestroyStream(stream);
}
absl::Status FaultInjectingBackend::ValidateStream(int device, Stream stream) {
  CMA_FAULT(kOther, "ValidateStream");
  return inner_.ValidateStream(device, stream);
}
absl::Status FaultInjectingBackend::SynchronizeStream(Stream stream) {
  CMA_FAULT(kStreamSync, "SynchronizeStream");
  return inner_.SynchronizeStream(stream);
}
absl::StatusOr<Event> FaultInjectingBackend::CreateEvent(int device) {
  CMA_FAULT(kEventCreate, "CreateEvent");
  return inner_.CreateEvent(device);
}
absl::Status FaultInjectingBackend::LaunchHostFunction(Stream stream,
                                                       absl::AnyInvocable<void() &&> fn) {
  CMA_FAULT(kOther, "LaunchHostFunction");  // `fn` is dropped unrun, as the contract says
  return inner_.LaunchHostFunction(stream, std::move(fn));
}
absl::Status FaultInjectingBackend::DestroyEvent(Event event) { return inner_.DestroyEvent(event); }
absl::Status FaultInjectingBackend::RecordEvent(Event event, Stream stream) {
  CMA_FAULT(kEventRecord, "RecordEvent");
  absl::Status s = inner_.RecordEvent(event, stream);
  if (s.ok()) {
    MutexLock l(&mu_);
    if (plan_.slow_event_queries > 0) slow_[event] = plan_.slow_event_queries;
  }
  return s;
}
absl::StatusOr<bool> FaultInjectingBackend::QueryStream(Stream stream) {
  CMA_FAULT(kEventQuery, "QueryStream");
  {
    MutexLock l(&mu_);
    // Slow completion, as for events: the first queries after new work see
    // the device still busy.
    if (plan_.slow_event_queries > 0 && slow_streams_[stream]++ % (plan_.slow_event_queries + 1) !=
                                            static_cast<unsigned>(plan_.slow_event_queries)) {
      return false;
    }
  }
  return inner_.QueryStream(stream);
}
absl::StatusOr<bool> FaultInjectingBackend::QueryEvent(Event event) {
  CMA_FAULT(kEventQuery, "QueryEvent");
  {
    MutexLock l(&mu_);
    auto it = slow_.find(event);
    if (it != slow_.end() && it->second > 0) {
      --it->second;
      return false;  // slow completion: the device is still busy
    }
  }
  return inner_.QueryEvent(event);
}
absl::Status FaultInjectingBackend::SynchronizeEvent(Event event) {
  CMA_FAULT(kEventQuery, "SynchronizeEvent");
  {
    MutexLock l(&mu_);
    slow_.erase(event);  // waiting makes it complete
  }
  return inner_.SynchronizeEvent(event);
}
absl::Status FaultInjectingBackend::StreamWaitEvent(Stream stream, Event event) {
  CMA_FAULT(kOther, "StreamWaitEvent");
  return inner_.StreamWaitEvent(stream, event);
}
absl::StatusOr<std::size_t> FaultInjectingBackend::VmmGranularity(int device) {
  return inner_.VmmGranularity(device);
}
absl::StatusOr<PhysicalHandle> FaultInjectingBackend::VmmCreate(int device, std::size_t bytes,
                                                                HandleType exportable) {
  CMA_FAULT(kAllocation, "VmmCreate");
  return inner_.VmmCreate(device, bytes, exportable);
}
absl::Status FaultInjectingBackend::VmmRelease(PhysicalHandle handle) {
  CMA_FAULT(kFree, "VmmRelease");
  return inner_.VmmRelease(handle);
}
absl::StatusOr<void*> FaultInjectingBackend::VmmReserve(std::size_t bytes, std::size_t alignment) {
  CMA_FAULT(kVmmMap, "VmmReserve");
  return inner_.VmmReserve(bytes, alignment);
}
absl::Status FaultInjectingBackend::VmmFreeAddress(void* address, std::size_t bytes) {
  return inner_.VmmFreeAddress(address, bytes);
}
absl::Status FaultInjectingBackend::VmmMap(void* address, std::size_t bytes,
                                           PhysicalHandle handle) {
  CMA_FAULT(kVmmMap, "VmmMap");
  return inner_.VmmMap(address, bytes, handle);
}
absl::Status FaultInjectingBackend::VmmUnmap(void* address, std::size_t bytes) {
  return inner_.VmmUnmap(address, bytes);
}
absl::Status FaultInjectingBackend::VmmSetAccess(void* address, std::size_t bytes,
                                                 absl::Span<const int> devices) {
  CMA_FAULT(kVmmMap, "VmmSetAccess");
  return inner_.VmmSetAccess(address, bytes, devices);
}
absl::StatusOr<ShareableHandle> FaultInjectingBackend::VmmExport(PhysicalHandle handle,
                                                                 HandleType type) {
  CMA_FAULT(kExport, "VmmExport");
  return inner_.VmmExport(handle, type);
}
absl::StatusOr<PhysicalHandle> FaultInjectingBackend::VmmImport(const ShareableHandle& shared) {
  CMA_FAULT(kExport, "VmmImport");
  return inner_.VmmImport(shared);
}
absl::StatusOr<MulticastHandle> FaultInjectingBackend::MulticastCreate(
    absl::Span<const int> devices, std::size_t bytes) {
  CMA_FAULT(kAllocation, "MulticastCreate");
  return inner_.MulticastCreate(devices, bytes);
}
absl::Status FaultInjectingBackend::MulticastAddDevice(MulticastHandle mc, int device) {
  CMA_FAULT(kOther, "MulticastAddDevice");
  return inner_.MulticastAddDevice(mc, device);
}
absl::Status FaultInjectingBackend::MulticastBindMemory(MulticastHandle mc, std::size_t mc_offset,
                                                        PhysicalHandle mem, std::size_t mem_offset,
                                                        std::size_t bytes) {
  CMA_FAULT(kOther, "MulticastBindMemory");
  return inner_.MulticastBindMemory(mc, mc_offset, mem, mem_offset, bytes);
}
absl::Status FaultInjectingBackend::MulticastRelease(MulticastHandle mc) {
  return inner_.MulticastRelease(mc);
}
absl::StatusOr<CommFacts> FaultInjectingBackend::GetCommFacts(CommHandle comm) {
  return inner_.GetCommFacts(comm);
}
absl::StatusOr<CommWindow> FaultInjectingBackend::RegisterCommWindow(CommHandle comm, void* ptr,
                                                                     std::size_t bytes) {
  CMA_FAULT(kCommWindow, "RegisterCommWindow");
  return inner_.RegisterCommWindow(comm, ptr, bytes);
}
absl::Status FaultInjectingBackend::DeregisterCommWindow(CommHandle comm, CommWindow window) {
  return inner_.DeregisterCommWindow(comm, window);
}
absl::Status FaultInjectingBackend::PeerCopy(void* dst, const void* src, std::size_t bytes,
                                             Stream stream) {
  CMA_FAULT(kCopy, "PeerCopy");
  return inner_.PeerCopy(dst, src, bytes, stream);
}
absl::StatusOr<void*> FaultInjectingBackend::ShmemMalloc(std::size_t bytes) {
  absl::StatusOr<void*> p = inner_.ShmemMalloc(bytes);
  if (!p.ok()) return p;
  CMA_FAULT(kShmemOutcome, "ShmemMalloc");  // joined and got memory: it stays in the heap
  return p;
}
absl::Status FaultInjectingBackend::ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                                             Stream stream) {
  CMA_FAULT(kCopy, "ShmemPut");
  return inner_.ShmemPut(dst, src, bytes, pe, stream);
}
absl::Status FaultInjectingBackend::ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                                             Stream stream) {
  CMA_FAULT(kCopy, "ShmemGet");
  return inner_.ShmemGet(dst, src, bytes, pe, stream);
}

}  // namespace cma
