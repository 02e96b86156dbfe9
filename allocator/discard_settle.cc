#include "allocator/discard_settle.h"

#include <algorithm>
#include <thread>

#include "backends/mutex_lock.h"

namespace cma {

DiscardSettle::DiscardSettle(std::chrono::microseconds settle) : settle_(settle) {}

void DiscardSettle::Mark(Backend& backend, int device, Stream stream) {
  if (settle_.count() <= 0) return;
  MutexLock l(&mu_);
  if (!have_events_) {
    auto d = backend.CreateTimingEvent(device);
    if (!d.ok()) return;
    auto p = backend.CreateTimingEvent(device);
    auto s = p.ok() ? backend.CreateStream(device) : absl::StatusOr<Stream>(p.status());
    if (!s.ok()) {
      (void)backend.DestroyEvent(*d);
      if (p.ok()) (void)backend.DestroyEvent(*p);
      return;
    }
    discarded_ = *d;
    probe_ = *p;
    probe_stream_ = *s;
    have_events_ = true;
  }
  marked_ = backend.RecordEvent(discarded_, stream).ok();
}

bool DiscardSettle::WaitOnHost(Backend& backend) {
  std::chrono::microseconds left{0};
  {
    MutexLock l(&mu_);
    if (!marked_) return true;
    auto done = backend.QueryEvent(discarded_);
    if (!done.ok()) return true;
    if (!*done) return false;
    // "Now" as the device's clock sees it: an event on a stream that runs
    // nothing else completes at once.
    if (!backend.RecordEvent(probe_, probe_stream_).ok() ||
        !backend.SynchronizeEvent(probe_).ok()) {
      return true;
    }
    auto ms = backend.ElapsedMs(discarded_, probe_);
    if (!ms.ok()) return true;
    // (A clock that ran backwards must not make the pause longer.)
    left = std::min(settle_,
                    settle_ - std::chrono::microseconds(static_cast<std::int64_t>(*ms * 1000)));
  }
  if (left.count() > 0) {
    waits_->fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(left);
  }
  return true;
}

void DiscardSettle::HoldStream(Backend& backend, Stream stream) {
  MutexLock l(&mu_);
  if (!marked_) return;
  // The function runs once the discards are done: all of the settle time
  // is still ahead then.
  (void)backend.LaunchHostFunction(stream, [waits = waits_, settle = settle_] {
    waits->fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(settle);
  });
}

void DiscardSettle::EndCycle() {
  MutexLock l(&mu_);
  marked_ = false;
}

void DiscardSettle::Release(Backend& backend) {
  MutexLock l(&mu_);
  if (!have_events_) return;
  (void)backend.DestroyEvent(discarded_);
  (void)backend.DestroyEvent(probe_);
  (void)backend.DestroyStream(probe_stream_);
  have_events_ = marked_ = false;
}

}  // namespace cma
