// Orders a Wake's population after the driver's work behind a Sleep's
// discards.
//
// Why: with driver 580 (H100, H200), managed pages populated again while
// the driver is still working behind a discard (~30 ms after the discard
// completed on its stream) were copied into by the copy engine at fault
// speed in about a third of the cycles: a 5 GB copy back took 0.3-6.9 s
// instead of 0.1 s, contents intact. The prefetch that populates them
// returned early in those cycles (8-19 ms instead of 20-30): pages the
// discard had not yet taken were skipped, then taken. A host function
// queued after a discard runs only once that work is done, so one on a
// stream of this object's own, behind the Sleep's discards, marks the moment
// without holding the Sleep's stream; the Wake's stream waits for it on the
// GPU. Measured: at once 4 of 12 wakes at fault speed, fenced 0 of 12, the
// sleep unchanged (bench/results/h100_wake_settle/, run S); through cma,
// off 2 of 24, on 0 of 24 (run T). A wake that
// comes later than that work pays nothing; one right behind the sleep waits
// ~20-30 ms for it. (A pause of 5 ms, tried first, did not prevent it:
// run R.)
//
// Thread safety: called under the owning DeviceAllocator's lock.
// Ownership: the stream and events it creates are given back by Release,
// which the owner calls before the backend goes. Errors: none; a backend
// without host functions or events gets no fence (only speed is at stake,
// never contents).
#ifndef CMA_ALLOCATOR_DISCARD_FENCE_H_
#define CMA_ALLOCATOR_DISCARD_FENCE_H_

#include <cstdint>

#include "backends/backend.h"

namespace cma {

class DiscardFence {
 public:
  // `enabled` false (config wake_fence:0): Mark and Order do nothing.
  explicit DiscardFence(bool enabled) : enabled_(enabled) {}

  // After the discards queued on `stream` (a stream of `device`).
  void Mark(Backend& backend, int device, Stream stream);
  // Before a population queued next on `stream`: `stream` waits (on the
  // GPU) for the driver's work behind the marked discards. `end_cycle`: a
  // Wake, after which no population needs it until the next Mark.
  // Returns whether `stream` was fenced.
  bool Order(Backend& backend, Stream stream, bool end_cycle);
  void Release(Backend& backend);

  // Populations ordered after a fence, since construction.
  std::int64_t fenced() const { return fenced_; }

 private:
  const bool enabled_;
  bool marked_ = false;
  bool have_side_ = false;
  Stream side_ = 0;        // runs only the fence's host functions
  Event discarded_ = 0;    // after the discards, on the Sleep's stream
  Event behind_ = 0;       // after the host function, on side_
  std::int64_t fenced_ = 0;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_DISCARD_FENCE_H_
