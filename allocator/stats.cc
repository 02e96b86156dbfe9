#include "allocator/stats.h"

#include "absl/strings/str_cat.h"

namespace cma {
namespace {

constexpr const char* kPoolNames[3] = {"all", "small_pool", "large_pool"};

void PutArray(std::map<std::string, std::int64_t>& m, const char* name, const StatArray& a) {
  for (int p = 0; p < 3; ++p) {
    const std::string prefix = absl::StrCat(name, ".", kPoolNames[p], ".");
    m[prefix + "current"] = a[p].current;
    m[prefix + "peak"] = a[p].peak;
    m[prefix + "allocated"] = a[p].allocated;
    m[prefix + "freed"] = a[p].freed;
  }
}

void AddArray(StatArray& a, const StatArray& b) {
  for (int p = 0; p < 3; ++p) {
    a[p].current += b[p].current;
    a[p].peak += b[p].peak;
    a[p].allocated += b[p].allocated;
    a[p].freed += b[p].freed;
  }
}

}  // namespace

#define CMA_FOR_EACH_STAT_ARRAY(X)                                                       \
  X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes) X(reserved_bytes) \
  X(active_bytes) X(inactive_split_bytes) X(requested_bytes) X(host_staging_bytes) \
  X(host_resident_bytes) X(away_bytes)
#define CMA_FOR_EACH_COUNTER(X)                                                          \
  X(num_alloc_retries) X(num_ooms) X(num_device_alloc) X(num_device_free)                 \
  X(num_sync_all_streams) X(num_cross_stream_reuse) X(prefetch_calls)                     \
  X(prefetched_bytes_to_device) X(prefetched_bytes_to_host) X(advise_calls)               \
  X(discarded_bytes) X(moves) X(num_placement_errors) X(managed_budget_bytes)            \
  X(virtual_bytes) X(idle_populated_bytes) X(peak_live_device_bytes) X(num_pages_populated) X(num_pages_discarded)  \
  X(discard_calls) X(kept_dead_bytes) X(num_discard_waits) X(sleep_staged_bytes) X(sleep_restored_bytes)  \
  X(num_wake_fences) X(host_budget_bytes) X(num_host_placements)    \
  X(host_overflow_bytes) X(sent_away_bytes) X(brought_back_bytes) \
  X(learned_steps) X(learned_plans) X(learned_divergences) X(learned_misses) \
  X(learned_send_host_us) X(learned_bring_host_us) X(learned_room_host_us) \
  X(learned_send_call_host_us) X(learned_bring_call_host_us)

std::map<std::string, std::int64_t> DeviceStats::Flatten() const {
  std::map<std::string, std::int64_t> m;
#define X(name) PutArray(m, #name, name);
  CMA_FOR_EACH_STAT_ARRAY(X)
#undef X
#define X(name) m[#name] = name;
  CMA_FOR_EACH_COUNTER(X)
#undef X
  return m;
}

DeviceStats& DeviceStats::operator+=(const DeviceStats& o) {
#define X(name) AddArray(name, o.name);
  CMA_FOR_EACH_STAT_ARRAY(X)
#undef X
#define X(name) name += o.name;
  CMA_FOR_EACH_COUNTER(X)
#undef X
  return *this;
}

}  // namespace cma
