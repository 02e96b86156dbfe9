// Statistics, snapshots and the memory fraction of the foreign-allocator
// pools of cma's PyTorch allocator (torch_foreign_pool.h).
#include <algorithm>
#include <cstdio>
#include <string>

#include "torch_allocator.h"
#include "torch_foreign_pool.h"

namespace cma_torch {
namespace internal {
namespace {

using c10::CachingAllocator::StatArray;
using c10::CachingDeviceAllocator::DeviceStats;

template <typename Fn>
void ForEachArray(DeviceStats& s, Fn fn) {
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                       &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                       &s.inactive_split_bytes, &s.requested_bytes}) {
    fn(*a);
  }
}

}  // namespace

// ---- statistics and snapshots ----

void ForeignPools::AddStats(int device, DeviceStats* s) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = stats_.find(device);
  if (it == stats_.end()) return;
  // Summed with cma's: currents and counters are exact; a peak is the sum of
  // both peaks, an upper bound of the joint peak (they need not coincide).
  std::vector<StatArray*> mine;
  ForEachArray(it->second, [&](StatArray& a) { mine.push_back(&a); });
  size_t i = 0;
  ForEachArray(*s, [&](StatArray& a) {
    const StatArray& f = *mine[i++];
    for (size_t k = 0; k < a.size(); ++k) {
      a[k].current += f[k].current;
      a[k].peak += f[k].peak;
      a[k].allocated += f[k].allocated;
      a[k].freed += f[k].freed;
    }
  });
  s->num_device_alloc += it->second.num_device_alloc;
  s->num_device_free += it->second.num_device_free;
}

void ForeignPools::ResetPeakStats(int device) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [d, s] : stats_) {
    if (device != -1 && d != device) continue;
    ForEachArray(s, [](StatArray& a) {
      for (auto& x : a) x.peak = x.current;
    });
  }
}

void ForeignPools::ResetAccumulatedStats(int device) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [d, s] : stats_) {
    if (device != -1 && d != device) continue;
    ForEachArray(s, [](StatArray& a) {
      for (auto& x : a) x.allocated = x.freed = 0;
    });
    s.num_device_alloc = s.num_device_free = 0;
  }
}

size_t ForeignPools::HeldBytes(int device) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = held_.find(device);
  return it == held_.end() ? 0 : it->second;
}

size_t ForeignPools::LargestFree(int device) {
  std::lock_guard<std::mutex> l(mu_);
  size_t largest = 0;
  for (auto& [key, p] : pools_by_key_) {
    if (p->device != device) continue;
    for (const auto* set : {&p->free_small, &p->free_large}) {
      for (const Block* b : *set) largest = std::max(largest, b->size);
    }
  }
  return largest;
}

void ForeignPools::AppendSnapshot(Pool id,
                                  std::vector<c10::CachingDeviceAllocator::SegmentInfo>* out) {
  const bool all = id.first == 0 && id.second == 0;
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [key, p] : pools_by_key_) {
    if (!all && p->id != id) continue;
    for (const Segment* seg : p->segments) {
      c10::CachingDeviceAllocator::SegmentInfo info;
      info.device = static_cast<c10::DeviceIndex>(p->device);
      info.address = reinterpret_cast<size_t>(seg->head->ptr);
      info.total_size = seg->size;
      info.stream = seg->head->stream;
      info.is_large = !seg->small;
      info.is_expandable = false;
      info.owner_private_pool_id = p->id;
      for (const Block* b = seg->head; b != nullptr; b = b->next) {
        c10::CachingDeviceAllocator::BlockInfo bi;
        bi.size = b->size;
        bi.requested_size = b->requested;
        bi.allocated = b->allocated;
        bi.active = !b->in_free;  // in use, or freed and awaiting other streams
        if (bi.allocated) {
          info.allocated_size += b->size;
          info.requested_size += b->requested;
        }
        if (bi.active) info.active_size += b->size;
        info.blocks.push_back(std::move(bi));
      }
      out->push_back(std::move(info));
    }
  }
}

// ---- memory fraction ----

// Counts `bytes` more as held on `device`, after checking them against the
// user's fraction (PyTorch's check: everything the allocator holds plus the
// new segment must fit in fraction * total).
void ForeignPools::Admit(int device, size_t bytes) {
  auto f = fractions_.find(device);
  if (f == fractions_.end()) {
    std::lock_guard<std::mutex> l(mu_);
    held_[device] += bytes;
    return;
  }
  size_t free_bytes = 0, total = 0;
  if (api.mem_info(device, &free_bytes, &total) != 0) Fail("allocate (a MemPool's allocator)");
  const int64_t cma_reserved = Get(Stats(device), "reserved_bytes.all.current");
  size_t held = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    held = held_[device];
  }
  const double allowed = f->second * static_cast<double>(total);
  const double wanted = static_cast<double>(cma_reserved) + static_cast<double>(held + bytes);
  if (wanted > allowed + 0.5) {
    char msg[480];
    std::snprintf(msg, sizeof(msg),
                  "CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity "
                  "of %.2f GiB of which %.2f GiB is free. %.2f GiB allowed; %.2f GiB is reserved "
                  "by caching_managed_allocator and %.2f GiB is held in MemPools of other "
                  "allocators (caching_managed_allocator: a MemPool's allocator would exceed "
                  "the memory fraction)",
                  bytes / kGiB, device, total / kGiB, free_bytes / kGiB, allowed / kGiB,
                  cma_reserved / kGiB, held / kGiB);
    TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(msg));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    held_[device] += bytes;
  }
  try {
    ApplyBudget(device, f->second);
  } catch (...) {
    std::lock_guard<std::mutex> l(mu_);
    held_[device] -= bytes;
    throw;
  }
}

// cma's budget: the user's share of the device less the foreign bytes held.
void ForeignPools::ApplyBudget(int device, double fraction) {
  size_t held = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = held_.find(device);
    if (it != held_.end()) held = it->second;
  }
  double cma_fraction = fraction;
  if (held > 0) {
    size_t free_bytes = 0, total = 0;
    if (api.mem_info(device, &free_bytes, &total) != 0) Fail("setMemoryFraction");
    const double rest = fraction * static_cast<double>(total) - static_cast<double>(held);
    cma_fraction = std::min(1.0, std::max(0.0, rest) / static_cast<double>(total));
  }
  if (api.set_memory_fraction(cma_fraction, device) != 0) Fail("setMemoryFraction");
}

void ForeignPools::UpdateBudget(int device) {
  std::lock_guard<std::mutex> b(budget_mu_);
  auto f = fractions_.find(device);
  if (f == fractions_.end()) return;
  try {
    ApplyBudget(device, f->second);
  } catch (const std::exception& e) {  // called from free paths: warn
    TORCH_WARN("caching_managed_allocator: updating cma's budget: ", e.what());
  }
}

void ForeignPools::SetFraction(double fraction, int device) {
  std::lock_guard<std::mutex> b(budget_mu_);
  if (!(fraction >= 0.0 && fraction <= 1.0)) {  // cma's own refusal names the problem
    if (api.set_memory_fraction(fraction, device) != 0) Fail("setMemoryFraction");
  }
  ApplyBudget(device, fraction);  // throws, changing nothing, for a bad device
  fractions_[device] = fraction;
}

bool ForeignPools::Fraction(int device, double* fraction) {
  std::lock_guard<std::mutex> b(budget_mu_);
  auto f = fractions_.find(device);
  if (f == fractions_.end()) return false;
  *fraction = f->second;
  return true;
}

}  // namespace internal
}  // namespace cma_torch
