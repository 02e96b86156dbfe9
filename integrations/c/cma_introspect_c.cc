// Introspection for frameworks' allocator interfaces (cma_c.h): the
// statistics as key/value pairs and a visitor over the snapshot, so that a
// framework's allocator class (PyTorch's c10 CUDAAllocator) can fill its own
// structures without parsing JSON.
#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "policy/size_policy.h"
#include "allocator/caching_managed_allocator.h"
#include "integrations/c/cma_c.h"
#include "integrations/c/cma_c_internal.h"

namespace {

// The keys handed out by cma_stats_pairs live here until the thread's next call.
thread_local std::map<std::string, std::int64_t> stat_pairs;
// The string handed out by cma_live_settings, likewise.
thread_local std::string live_pytorch_settings;

}  // namespace

extern "C" {

long long cma_stats_pairs(int device, cma_stat_pair* out, size_t cap) {
  cma::CachingManagedAllocator* a = cma::capi::Get();
  if (a == nullptr) return -1;
  if (device == -1) {
    stat_pairs = a->GetStats().Flatten();
  } else {
    absl::StatusOr<cma::DeviceStats> s = a->GetStats(device);
    if (!s.ok()) return cma::capi::Fail(s.status());
    stat_pairs = s->Flatten();
  }
  std::size_t i = 0;
  for (const auto& [key, value] : stat_pairs) {
    if (i == cap) break;
    out[i++] = {key.c_str(), static_cast<long long>(value)};
  }
  return static_cast<long long>(stat_pairs.size());
}

int cma_snapshot_visit(void (*on_segment)(void* ctx, const cma_segment_info* segment),
                       void (*on_block)(void* ctx, const cma_block_info* block), void* ctx) {
  cma::CachingManagedAllocator* a = cma::capi::Get();
  if (a == nullptr) return -1;
  if (on_segment == nullptr || on_block == nullptr) {
    return cma::capi::Fail(
        absl::InvalidArgumentError("cma_snapshot_visit: both callbacks are required"));
  }
  for (const cma::SegmentSnapshot& seg : a->Snapshot()) {  // a copy: no lock held below
    // An arena is address space: it is reported up to its last block in use
    // or its last page still populated, rounded up to a page (its idle tail
    // would show terabytes of "reserved" memory to PyTorch's tools). Free
    // blocks over populated pages stay in view, as PyTorch's cached blocks
    // do until empty_cache.
    std::size_t end = ~std::size_t{0};
    if (seg.is_arena) {
      end = 0;
      for (const cma::BlockSnapshot& b : seg.blocks) {
        const std::size_t used = b.state != "inactive" ? b.size : b.populated_end;
        if (used > 0) end = std::max(end, b.address + used - seg.address);
      }
      end = (end + cma::kPageSize - 1) / cma::kPageSize * cma::kPageSize;
      if (end == 0) continue;
    }
    std::vector<cma_block_info> blocks;
    for (const cma::BlockSnapshot& b : seg.blocks) {
      const std::size_t start = b.address - seg.address;
      if (start >= end) break;
      cma_block_info info{};
      info.address = b.address;
      info.size = std::min(b.size, end - start);
      info.requested_size = b.requested;
      info.allocated = b.state == "active_allocated";
      info.active = b.state != "inactive";
      info.stream = reinterpret_cast<void*>(b.stream);
      info.pool0 = b.pool.first;
      info.pool1 = b.pool.second;
      info.own_segment = b.own_segment;
      blocks.push_back(info);
    }
    cma_segment_info s{};
    s.device = seg.device;
    s.is_large = seg.segment_type == "large";
    s.is_arena = seg.is_arena;
    s.address = seg.address;
    s.allocated_size = seg.allocated_size;
    s.requested_size = seg.requested_size;
    s.populated_bytes = seg.populated_bytes;
    s.n_blocks = blocks.size();
    for (const cma_block_info& b : blocks) s.total_size += b.size;
    on_segment(ctx, &s);
    for (const cma_block_info& b : blocks) on_block(ctx, &b);
  }
  return 0;
}

int cma_live_settings(cma_live_settings_info* out) {
  cma::CachingManagedAllocator* a = cma::capi::Get();
  if (a == nullptr) return -1;
  if (out == nullptr) {
    return cma::capi::Fail(absl::InvalidArgumentError("cma_live_settings: null output"));
  }
  const cma::AllocatorConfig live = a->LiveConfig();
  *out = cma_live_settings_info{};
  out->max_split_size = live.max_split_size;
  out->garbage_collection_threshold = live.garbage_collection_threshold;
  static_assert(CMA_ROUNDUP_INTERVALS == cma::RoundupDivisions::kIntervals,
                "cma_c.h's interval count is policy/roundup_divisions.h's");
  for (int i = 0; i < CMA_ROUNDUP_INTERVALS; ++i) {
    // Interval i holds sizes from 1 MiB << i (the first: every size below 2 MiB).
    out->roundup_power2_divisions[i] =
        static_cast<size_t>(live.roundup_power2_divisions.For(std::size_t{1} << (20 + i)));
  }
  out->is_arena = live.segments == cma::SegmentMode::kArena;
  live_pytorch_settings = cma::capi::PyTorchSettings();
  out->pytorch_settings = live_pytorch_settings.c_str();
  return 0;
}

char* cma_host_snapshot_json(void) {
  cma::CachingManagedAllocator* a = cma::capi::Get();
  if (a == nullptr) return nullptr;
  nlohmann::json out = nlohmann::json::array();
  for (const cma::BlockSnapshot& b : a->HostSnapshot()) {
    out.push_back({{"address", b.address},
                   {"size", b.size},
                   {"requested_size", b.requested},
                   {"state", b.state},
                   {"stream", b.stream},
                   {"location", b.location}});
  }
  return cma::capi::CopyString(out.dump());
}

}  // extern "C"
