// GateBackend: forwards every call to a HostBackend. Calls made by any
// thread other than the one that built it (the allocator's transfer thread)
// may be made to take `delay_ms`, as the driver's prefetch to a full device
// held its caller, or to fail; calls begun while the test says a capture is
// under way are counted. Test-only; safe to call from any thread.
#ifndef CMA_TESTS_GATE_BACKEND_H_
#define CMA_TESTS_GATE_BACKEND_H_

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "backends/host/host_backend.h"

namespace cma {

class GateBackend final : public Backend {
 public:
  explicit GateBackend(HostBackend& inner) : in_(inner), main_(std::this_thread::get_id()) {}

  // ---- test controls ----
  std::atomic<int> delay_ms{0};
  std::atomic<int> busy{0};  // the other thread's calls inside their delay
  std::atomic<bool> capture_under_way{false};
  std::atomic<int> calls_during_capture{0};  // by the other thread
  std::atomic<int> other_thread_calls{0};
  std::atomic<bool> fail_other_thread_prefetch{false};
  std::atomic<int> failed{0};

  const char* name() const override { return in_.name(); }
  absl::StatusOr<int> DeviceCount() override { return in_.DeviceCount(); }
  absl::StatusOr<DeviceFacts> GetDeviceFacts(int d) override { return in_.GetDeviceFacts(d); }
  absl::StatusOr<MemInfo> GetMemInfo(int d) override { return in_.GetMemInfo(d); }
  absl::StatusOr<MemInfo> GetHostMemInfo() override { return in_.GetHostMemInfo(); }
  absl::StatusOr<void*> AllocateManaged(int d, std::size_t b) override {
    return in_.AllocateManaged(d, b);
  }
  absl::Status FreeManaged(void* p) override { return in_.FreeManaged(p); }
  absl::StatusOr<void*> ReserveManaged(int d, std::size_t b) override {
    return in_.ReserveManaged(d, b);
  }
  absl::Status Advise(void* p, std::size_t b, Advice a, Location l) override {
    Gate();
    return in_.Advise(p, b, a, l);
  }
  absl::Status Prefetch(void* p, std::size_t b, Location l, Stream s) override {
    if (Gate(/*prefetch=*/true)) return absl::InternalError("gate: injected prefetch failure");
    return in_.Prefetch(p, b, l, s);
  }
  absl::Status PrefetchBatch(absl::Span<const Range> r, Location l, Stream s) override {
    if (Gate(/*prefetch=*/true)) return absl::InternalError("gate: injected prefetch failure");
    return in_.PrefetchBatch(r, l, s);
  }
  absl::Status DiscardBatch(absl::Span<const Range> r, Stream s) override {
    Gate();
    return in_.DiscardBatch(r, s);
  }
  absl::Status DiscardAndPrefetchBatch(absl::Span<const Range> r, Location l, Stream s) override {
    Gate();
    return in_.DiscardAndPrefetchBatch(r, l, s);
  }
  absl::StatusOr<RangeAttributes> GetRangeAttributes(void* p, std::size_t b) override {
    return in_.GetRangeAttributes(p, b);
  }
  absl::StatusOr<void*> AllocatePinnedHost(std::size_t b) override {
    return in_.AllocatePinnedHost(b);
  }
  absl::Status FreePinnedHost(void* p) override { return in_.FreePinnedHost(p); }
  absl::Status CopyBatch(absl::Span<const Copy> c, Stream s) override {
    Gate();
    return in_.CopyBatch(c, s);
  }
  absl::StatusOr<Stream> CreateStream(int d) override { return in_.CreateStream(d); }
  absl::Status DestroyStream(Stream s) override { return in_.DestroyStream(s); }
  absl::Status ValidateStream(int d, Stream s) override { return in_.ValidateStream(d, s); }
  absl::Status SynchronizeStream(Stream s) override {
    Gate();
    return in_.SynchronizeStream(s);
  }
  absl::StatusOr<bool> QueryStream(Stream s) override {
    Gate();
    return in_.QueryStream(s);
  }
  absl::Status LaunchHostFunction(Stream s, absl::AnyInvocable<void() &&> fn) override {
    return in_.LaunchHostFunction(s, std::move(fn));
  }
  absl::StatusOr<bool> IsCapturing(Stream s) override { return in_.IsCapturing(s); }
  absl::StatusOr<std::optional<CaptureFrontier>> CaptureFrontierOf(Stream s) override {
    return in_.CaptureFrontierOf(s);
  }
  absl::StatusOr<std::vector<CaptureNode>> CaptureNodeDependencies(CaptureNode n) override {
    return in_.CaptureNodeDependencies(n);
  }
  absl::StatusOr<Event> CreateEvent(int d) override { return in_.CreateEvent(d); }
  absl::Status DestroyEvent(Event e) override { return in_.DestroyEvent(e); }
  absl::Status RecordEvent(Event e, Stream s) override {
    Gate();
    return in_.RecordEvent(e, s);
  }
  absl::StatusOr<bool> QueryEvent(Event e) override {
    Gate();
    return in_.QueryEvent(e);
  }
  absl::Status SynchronizeEvent(Event e) override {
    Gate();
    return in_.SynchronizeEvent(e);
  }
  absl::Status StreamWaitEvent(Stream s, Event e) override {
    Gate();
    return in_.StreamWaitEvent(s, e);
  }
  absl::StatusOr<std::size_t> VmmGranularity(int d) override { return in_.VmmGranularity(d); }
  absl::StatusOr<PhysicalHandle> VmmCreate(int d, std::size_t b, HandleType t) override {
    return in_.VmmCreate(d, b, t);
  }
  absl::Status VmmRelease(PhysicalHandle h) override { return in_.VmmRelease(h); }
  absl::StatusOr<void*> VmmReserve(std::size_t b, std::size_t a) override {
    return in_.VmmReserve(b, a);
  }
  absl::Status VmmFreeAddress(void* a, std::size_t b) override { return in_.VmmFreeAddress(a, b); }
  absl::Status VmmMap(void* a, std::size_t b, PhysicalHandle h) override {
    return in_.VmmMap(a, b, h);
  }
  absl::Status VmmUnmap(void* a, std::size_t b) override { return in_.VmmUnmap(a, b); }
  absl::Status VmmSetAccess(void* a, std::size_t b, absl::Span<const int> d) override {
    return in_.VmmSetAccess(a, b, d);
  }
  absl::StatusOr<ShareableHandle> VmmExport(PhysicalHandle h, HandleType t) override {
    return in_.VmmExport(h, t);
  }
  absl::StatusOr<PhysicalHandle> VmmImport(const ShareableHandle& s) override {
    return in_.VmmImport(s);
  }
  absl::StatusOr<MulticastHandle> MulticastCreate(absl::Span<const int> d,
                                                  std::size_t b) override {
    return in_.MulticastCreate(d, b);
  }
  absl::Status MulticastAddDevice(MulticastHandle m, int d) override {
    return in_.MulticastAddDevice(m, d);
  }
  absl::Status MulticastBindMemory(MulticastHandle m, std::size_t mo, PhysicalHandle h,
                                   std::size_t o, std::size_t b) override {
    return in_.MulticastBindMemory(m, mo, h, o, b);
  }
  absl::Status MulticastRelease(MulticastHandle m) override { return in_.MulticastRelease(m); }

 private:
  // Returns true when the call must fail (an injected prefetch failure).
  bool Gate(bool prefetch = false) {
    if (std::this_thread::get_id() == main_) return false;
    if (capture_under_way) ++calls_during_capture;
    ++other_thread_calls;
    if (const int ms = delay_ms.load(); ms > 0) {
      ++busy;
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      --busy;
    }
    if (prefetch && fail_other_thread_prefetch) {
      ++failed;
      return true;
    }
    return false;
  }

  HostBackend& in_;
  const std::thread::id main_;
};

}  // namespace cma

#endif  // CMA_TESTS_GATE_BACKEND_H_
