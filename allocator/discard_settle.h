// Keeps a Wake's population a few milliseconds clear of a Sleep's discards.
//
// Why: with driver 580 (H100 and H200), managed pages populated again right
// after a discard completed on the stream were copied into by the copy
// engine at fault speed in 9 of 26 raw cycles (a 5 GB copy back took
// 0.3-3.8 s instead of 0.1 s), although their population had completed. A
// pause of 5 ms or more on the host between the sleep's completion and the
// wake: 0 of 30; writing a byte of every page first, stating the preferred
// location again, synchronising between population and copies and naming
// the copy's direction did not help. (Through cma's own path the
// pathology was rarer, 1 of 24 with and without the pause on one machine,
// 5 of 20 on another before the pause existed.) The
// driver goes on working for ~30 ms after a discard completes on the
// stream, and a host function queued anywhere after it runs only once that
// work is done: a host function after the Sleep's discards would lengthen
// every Sleep by those 30 ms. So the pause is measured with timing events,
// not host functions (bench/results/h100_wake_settle/).
//
// How: Mark records a timing event after a Sleep's discards. A Wake first
// calls WaitOnHost (outside the allocator's lock): when the discards have
// completed, it sleeps on the caller's thread for what is left of the settle
// time since they completed (nothing once the caller has spent it anyway).
// When they have not (a Wake queued right behind its Sleep), WaitOnHost
// returns false and the Wake calls HoldStream once ordered after the Sleep:
// a host function on its stream waits out the settle time there.
//
// Thread safety: every method may be called from any thread; Mark,
// HoldStream and EndCycle under the owner's lock, WaitOnHost without it.
// Ownership: the events and the stream it creates are given back by
// Release, which the owner calls before the backend goes. Errors: none; a
// backend without timing events or host functions gets no pause (only
// speed is at stake, never contents).
#ifndef CMA_ALLOCATOR_DISCARD_SETTLE_H_
#define CMA_ALLOCATOR_DISCARD_SETTLE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"

namespace cma {

class DiscardSettle {
 public:
  // `settle`: the least time between the discards' completion and the next
  // population; zero turns the pause off.
  explicit DiscardSettle(std::chrono::microseconds settle);

  // After the discards queued on `stream` (a stream of `device`).
  void Mark(Backend& backend, int device, Stream stream);
  // Sleeps on this thread for what is left of the settle time after the
  // marked discards; false when they have not completed yet (HoldStream
  // must then hold the population's stream instead).
  bool WaitOnHost(Backend& backend);
  // On `stream`, ordered after the marked discards: waits out the settle
  // time there, in stream order.
  void HoldStream(Backend& backend, Stream stream);
  // No later population needs the pause (a Wake has queued its own).
  void EndCycle();
  void Release(Backend& backend);

  // Pauses taken (on the host or on a stream), since construction.
  std::int64_t waits() const { return waits_->load(std::memory_order_relaxed); }

 private:
  const std::chrono::microseconds settle_;
  absl::Mutex mu_;
  bool marked_ ABSL_GUARDED_BY(mu_) = false;
  bool have_events_ ABSL_GUARDED_BY(mu_) = false;
  Event discarded_ ABSL_GUARDED_BY(mu_) = 0;  // recorded after the discards
  Event probe_ ABSL_GUARDED_BY(mu_) = 0;      // "now", on an idle stream of ours
  Stream probe_stream_ ABSL_GUARDED_BY(mu_) = 0;
  // Shared with the host functions, which may run after this object goes.
  std::shared_ptr<std::atomic<std::int64_t>> waits_ =
      std::make_shared<std::atomic<std::int64_t>>(0);
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_DISCARD_SETTLE_H_
