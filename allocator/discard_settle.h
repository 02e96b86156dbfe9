// Holds a Wake's population back until a Sleep's discards have settled.
//
// Why: with driver 580 (H100 and H200), managed pages populated again
// within a few milliseconds of a discard's completion are copied into by
// the copy engine at fault speed in about half the cycles (a 5 GB copy back
// took 0.3-3.8 s instead of 0.1 s), although the population itself had
// completed: writing one byte of each page first, stating the preferred
// location again, synchronising between population and copies, and naming
// the copy's direction did not help; a 5 ms pause between the discard's
// completion and the population avoided it in every cycle measured
// (bench/results/h100_wake_settle/). The pause is in stream order, not on
// the caller's thread: a host function notes when the discards completed,
// and another, queued before the population, waits out what is left of the
// settle time (nothing once the caller has spent it anyway).
//
// Thread safety: Mark and Hold are called under the owner's lock; the host
// functions share only an atomic with this object, which they keep alive.
// Errors: none; a backend that cannot run host functions gets no pause
// (only speed is at stake, never contents).
#ifndef CMA_ALLOCATOR_DISCARD_SETTLE_H_
#define CMA_ALLOCATOR_DISCARD_SETTLE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "backends/backend.h"

namespace cma {

class DiscardSettle {
 public:
  // `settle`: the pause after the discards' completion; zero turns it off.
  explicit DiscardSettle(std::chrono::microseconds settle);

  // After the discards queued on `stream` (in its order): notes when they
  // completed.
  void Mark(Backend& backend, Stream stream);
  // Before a population queued next on `stream`, which is ordered after
  // the marked discards: holds the stream until the settle time has passed
  // since they completed. `end_cycle`: no later population needs it (a
  // Wake); a later Hold waits only for a later Mark.
  void Hold(Backend& backend, Stream stream, bool end_cycle);

  // Holds that found the settle time not yet spent, since construction.
  std::int64_t waits() const { return state_->waits.load(std::memory_order_relaxed); }

 private:
  struct State {
    std::atomic<std::int64_t> done_ns{0};  // steady clock; 0: not yet
    std::atomic<std::int64_t> waits{0};
  };
  std::chrono::microseconds settle_;
  std::shared_ptr<State> state_ = std::make_shared<State>();
  bool marked_ = false;  // a Mark since the last cycle's end
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_DISCARD_SETTLE_H_
