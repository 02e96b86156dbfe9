// DeviceAllocator's queries: record_stream, lookups, statistics and the
// snapshot.
#include "allocator/device_allocator.h"
#include "backends/mutex_lock.h"

namespace cma {

absl::Status DeviceAllocator::RecordStream(void* ptr, Stream stream) {
  MutexLock l(&mu_);
  auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocated_.end()) return NotMine();
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  Block* b = it->second;
  if (stream == b->stream) return absl::OkStatus();
  if (std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
    b->stream_uses.push_back(stream);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::size_t, Stream>> DeviceAllocator::Lookup(void* ptr) {
  MutexLock l(&mu_);
  auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocated_.end()) return NotMine();
  return std::make_pair(it->second->requested, it->second->stream);
}

DeviceStats DeviceAllocator::GetStats() {
  MutexLock l(&mu_);
  DeviceStats s = stats_;
  s.peak_live_device_bytes = static_cast<std::int64_t>(peak_live_pages_ * kPageSize);
  if (learn_ != nullptr) {
    const LearnedSchedule::Counts& c = learn_->schedule.counts();
    s.learned_steps = c.steps;
    s.learned_plans = c.plans;
    s.learned_divergences = c.divergences;
    s.learned_misses = learn_->misses;
    s.learned_send_host_us = learn_->send_host_us;
    s.learned_bring_host_us = learn_->bring_host_us;
    s.learned_room_host_us = learn_->room_host_us;
    s.learned_send_call_host_us = learn_->send_call_host_us;
    s.learned_bring_call_host_us = learn_->bring_call_host_us;
  }
  return s;
}

absl::Status DeviceAllocator::LastPlacementError() {
  MutexLock l(&mu_);
  return last_placement_error_;
}

void DeviceAllocator::NotePlacementError(absl::Status s) {
  ++stats_.num_placement_errors;
  last_placement_error_ = std::move(s);
}

void DeviceAllocator::ResetPeakStats() {
  MutexLock l(&mu_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes,
                       &stats_.host_staging_bytes, &stats_.host_resident_bytes,
                       &stats_.away_bytes}) {
    for (Stat& s : *a) s.peak = s.current;
  }
  peak_live_pages_ = populated_pages() - idle_pages_;
}

std::size_t DeviceAllocator::TakeLivePeak() {
  MutexLock l(&mu_);
  const std::size_t peak = window_live_pages_;
  window_live_pages_ = populated_pages() - idle_pages_;
  return peak * kPageSize;
}

void DeviceAllocator::ResetAccumulatedStats() {
  MutexLock l(&mu_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes,
                       &stats_.host_staging_bytes, &stats_.host_resident_bytes,
                       &stats_.away_bytes}) {
    for (Stat& s : *a) s.allocated = s.freed = 0;
  }
  stats_.num_alloc_retries = stats_.num_ooms = stats_.num_device_alloc = stats_.num_device_free = 0;
  stats_.num_sync_all_streams = stats_.num_cross_stream_reuse = 0;
  stats_.num_pages_populated = stats_.num_pages_discarded = stats_.discard_calls = 0;
  stats_.kept_dead_bytes = 0;
  stats_.num_discard_waits = 0;
  stats_.sleep_staged_bytes = stats_.sleep_restored_bytes = 0;
  stats_.num_wake_fences = 0;
  stats_.num_host_placements = stats_.host_overflow_bytes = 0;
  stats_.sent_away_bytes = stats_.brought_back_bytes = 0;
}

void DeviceAllocator::AppendSnapshot(std::vector<SegmentSnapshot>* out) {
  MutexLock l(&mu_);
  for (auto& entry : segments_) {
    // (Not a structured binding: the lambda below captures it, which C++17
    // allows only for a variable.)
    const auto& seg = entry.second;
    SegmentSnapshot s;
    s.device = device_;
    s.address = seg->base;
    s.total_size = seg->size;
    s.segment_type = seg->pool == PoolKind::kSmall ? "small" : "large";
    s.is_arena = seg->arena;
    s.populated_bytes = seg->arena ? seg->pages.populated_count() * kPageSize : seg->size;
    s.on_host = seg->host_tier;
    if (seg->host_tier) s.populated_bytes = 0;
    // The extent of a block's populated pages, from its start (see
    // BlockSnapshot::populated_end).
    auto populated_end = [&](std::uintptr_t addr, std::size_t size) -> std::size_t {
      if (!seg->arena) return size;
      const std::size_t lo = (addr - seg->base) / kPageSize;
      const std::size_t hi = (addr + size - seg->base + kPageSize - 1) / kPageSize;
      const std::size_t end = seg->host_tier ? lo : seg->pages.PopulatedEnd(lo, hi);
      return end == lo ? 0 : std::min(size, end * kPageSize - (addr - seg->base));
    };
    Placement last_placement;  // of s.blocks.back(), as a merge would leave it
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      // Free neighbours that Free left apart (CoalesceUnmerged merges them
      // lazily) are one free block to a reader, as PyTorch merges on free:
      // its tools and tests count blocks. Only what a merge would join:
      // same stream and pool, neither a segment of its own.
      if (!b->allocated && b->pending_events == 0 && !s.blocks.empty()) {
        BlockSnapshot& last = s.blocks.back();
        const MemPoolId pool =
            b->mempool != 0 && mempools_.contains(b->mempool) ? mempools_.at(b->mempool).id
                                                               : MemPoolId{0, 0};
        if (last.state == "inactive" && last.address + last.size == b->addr &&
            last.stream == b->stream && last.pool == pool && !last.own_segment &&
            !b->no_split) {
          last.size += b->size;
          last.populated_end = populated_end(last.address, last.size);
          last_placement = MergedPlacement(last_placement, {b->placed, b->location},
                                           Location::Device(device_));
          last.location = last_placement.placed ? LocationName(last_placement.location)
                                                : "unplaced";
          continue;
        }
      }
      BlockSnapshot bs;
      bs.address = b->addr;
      bs.size = b->size;
      bs.requested = b->requested;
      bs.stream = b->stream;
      bs.location = b->placed ? LocationName(b->location) : "unplaced";
      last_placement = {b->placed, b->location};
      if (b->mempool != 0) {
        auto pool = mempools_.find(b->mempool);
        if (pool != mempools_.end()) bs.pool = pool->second.id;
      }
      bs.populated_end = populated_end(b->addr, b->size);
      bs.own_segment = b->no_split;
      bs.away = b->away;
      bs.state = b->allocated ? "active_allocated"
                              : (b->pending_events > 0 ? "active_pending_free" : "inactive");
      if (b->allocated) {
        s.allocated_size += b->size;
        s.requested_size += b->requested;
      }
      s.blocks.push_back(bs);
    }
    out->push_back(std::move(s));
  }
}

}  // namespace cma
