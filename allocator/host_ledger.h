// HostLedger: the bytes of managed memory cma holds placed on the host, shared
// by the host pool (CPU tensors, host_pool.h) and every device's host tier
// (oversubscription, host_tier.cc), so that together they never hold more
// than one cap (the host's memory). Each keeps its own budget as well; the
// ledger is what stops the two from counting the same memory twice.
//
// Thread-safe and lock-free (one atomic): callers hold their own locks, never
// this one's. The ledger must outlive everything that takes from it.
#ifndef CMA_ALLOCATOR_HOST_LEDGER_H_
#define CMA_ALLOCATOR_HOST_LEDGER_H_

#include <atomic>
#include <cstddef>

namespace cma {

class HostLedger {
 public:
  explicit HostLedger(std::size_t cap) : cap_(cap) {}
  HostLedger(const HostLedger&) = delete;
  HostLedger& operator=(const HostLedger&) = delete;

  // Takes `bytes` when what is held stays within the cap; false, taking
  // nothing, otherwise.
  bool TryTake(std::size_t bytes) {
    std::size_t held = held_.load(std::memory_order_relaxed);
    do {
      if (bytes > cap_ || held > cap_ - bytes) return false;
    } while (!held_.compare_exchange_weak(held, held + bytes, std::memory_order_relaxed));
    return true;
  }
  // Gives back bytes a TryTake took.
  void Give(std::size_t bytes) { held_.fetch_sub(bytes, std::memory_order_relaxed); }

  std::size_t held() const { return held_.load(std::memory_order_relaxed); }
  std::size_t cap() const { return cap_; }

 private:
  const std::size_t cap_;
  std::atomic<std::size_t> held_{0};
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_HOST_LEDGER_H_
