#include "allocator/discard_settle.h"

#include <thread>
#include <utility>

namespace cma {
namespace {

std::int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

DiscardSettle::DiscardSettle(std::chrono::microseconds settle) : settle_(settle) {}

void DiscardSettle::Mark(Backend& backend, Stream stream) {
  if (settle_.count() <= 0) return;
  state_->done_ns.store(0, std::memory_order_relaxed);
  // Best effort: without the mark the Hold below has nothing to wait for.
  backend
      .LaunchHostFunction(stream, [state = state_] {
        state->done_ns.store(NowNs(), std::memory_order_release);
      })
      .IgnoreError();
  marked_ = true;
}

void DiscardSettle::Hold(Backend& backend, Stream stream, bool end_cycle) {
  if (!marked_) return;
  if (end_cycle) marked_ = false;
  const std::int64_t settle_ns = std::chrono::nanoseconds(settle_).count();
  backend
      .LaunchHostFunction(stream, [state = state_, settle_ns] {
        // The Mark's function has run: this stream is ordered after it.
        const std::int64_t done = state->done_ns.load(std::memory_order_acquire);
        const std::int64_t left = done + settle_ns - NowNs();
        if (done == 0 || left <= 0) return;
        state->waits.fetch_add(1, std::memory_order_relaxed);
        std::this_thread::sleep_for(std::chrono::nanoseconds(left));
      })
      .IgnoreError();
}

}  // namespace cma
