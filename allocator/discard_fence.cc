#include "allocator/discard_fence.h"

namespace cma {

void DiscardFence::Mark(Backend& backend, int device, Stream stream) {
  if (!enabled_) return;
  marked_ = false;
  if (!have_side_) {
    auto s = backend.CreateStream(device);
    if (!s.ok()) return;
    auto d = backend.CreateEvent(device);
    auto b = d.ok() ? backend.CreateEvent(device) : absl::StatusOr<Event>(d.status());
    if (!b.ok()) {
      if (d.ok()) (void)backend.DestroyEvent(*d);
      (void)backend.DestroyStream(*s);
      return;
    }
    side_ = *s;
    discarded_ = *d;
    behind_ = *b;
    have_side_ = true;
  }
  // Best effort throughout: a failed step leaves no fence, and the Wake
  // populates as it would without one.
  marked_ = backend.RecordEvent(discarded_, stream).ok() &&
            backend.StreamWaitEvent(side_, discarded_).ok() &&
            backend.LaunchHostFunction(side_, [] {}).ok() &&
            backend.RecordEvent(behind_, side_).ok();
}

bool DiscardFence::Order(Backend& backend, Stream stream, bool end_cycle) {
  if (!marked_) return false;
  const bool fenced = backend.StreamWaitEvent(stream, behind_).ok();
  if (fenced) ++fenced_;
  if (end_cycle) marked_ = false;
  return fenced;
}

void DiscardFence::Release(Backend& backend) {
  if (!have_side_) return;
  (void)backend.SynchronizeStream(side_);
  (void)backend.DestroyEvent(discarded_);
  (void)backend.DestroyEvent(behind_);
  (void)backend.DestroyStream(side_);
  have_side_ = marked_ = false;
}

}  // namespace cma
