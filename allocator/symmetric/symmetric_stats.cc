// SymmetricHeap's statistics and snapshot: a copy of the heap's state kept
// under its own lock, so that reading it never waits behind a collective
// (Allocate and EmptyCache hold the heap's lock while other processes catch
// up, for as long as the exchange's timeout).
#include <algorithm>

#include "allocator/symmetric/symmetric_heap.h"
#include "backends/mutex_lock.h"

namespace cma {

void SymmetricHeap::PublishHit(const Entry& e) {
  MutexLock l(&stats_mu_);
  stats_.cached_bytes -= static_cast<std::int64_t>(e.own_bytes);
  ++stats_.cache_hits;
  ++stats_.allocations;
  SymmetricSnapshot& v = views_[e.a.id];
  v.bytes = e.a.bytes;  // a hit may hand the allocation out at another size
  v.cached = false;
}

void SymmetricHeap::PublishMiss(const Entry& e) {
  MutexLock l(&stats_mu_);
  stats_.symmetric_bytes += static_cast<std::int64_t>(e.own_bytes);
  stats_.symmetric_bytes_peak = std::max(stats_.symmetric_bytes_peak, stats_.symmetric_bytes);
  ++stats_.allocations;
  stats_.last_miss_seconds = miss_seconds_;
  views_[e.a.id] = {e.a.id, e.a.bytes, e.a.stride, false, e.a.peers};
}

void SymmetricHeap::PublishFree(const Entry& e) {
  MutexLock l(&stats_mu_);
  stats_.cached_bytes += static_cast<std::int64_t>(e.own_bytes);
  views_[e.a.id].cached = true;
}

void SymmetricHeap::PublishEmptied(const Entry& e) {
  MutexLock l(&stats_mu_);
  stats_.symmetric_bytes -= static_cast<std::int64_t>(e.own_bytes);
  stats_.cached_bytes -= static_cast<std::int64_t>(e.own_bytes);
  views_.erase(e.a.id);
}

SymmetricStats SymmetricHeap::GetStats() {
  MutexLock l(&stats_mu_);
  return stats_;
}

std::vector<SymmetricSnapshot> SymmetricHeap::Snapshot() {
  MutexLock l(&stats_mu_);
  std::vector<SymmetricSnapshot> out;
  out.reserve(views_.size());
  for (bool cached : {false, true}) {
    for (const auto& [id, v] : views_) {
      if (v.cached == cached) out.push_back(v);
    }
  }
  return out;
}

}  // namespace cma
