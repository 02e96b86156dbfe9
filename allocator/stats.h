// Allocator statistics with PyTorch's names and meaning
// (torch.cuda.memory_stats), plus managed-memory counters.
//
// Value types; the allocator fills them under its lock and hands out copies.
#ifndef CMA_ALLOCATOR_STATS_H_
#define CMA_ALLOCATOR_STATS_H_

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace cma {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // total ever added
  std::int64_t freed = 0;      // total ever removed

  void Add(std::int64_t n) {
    current += n;
    allocated += n;
    if (current > peak) peak = current;
  }
  void Sub(std::int64_t n) {
    current -= n;
    freed += n;
  }
  void Update(std::int64_t delta) {
    if (delta >= 0) {
      Add(delta);
    } else {
      Sub(-delta);
    }
  }
};

// Index 0: all pools; 1: small pool; 2: large pool.
using StatArray = std::array<Stat, 3>;
enum StatPool { kAllPools = 0, kSmallPool = 1, kLargePool = 2 };

struct DeviceStats {
  StatArray allocation;  // blocks handed to callers
  StatArray segment;     // backend allocations
  StatArray active;      // allocated blocks plus freed ones still awaiting events
  StatArray inactive_split;  // free blocks that are pieces of a split segment
  StatArray allocated_bytes;
  StatArray reserved_bytes;
  StatArray active_bytes;
  StatArray inactive_split_bytes;
  StatArray requested_bytes;
  // Pinned host memory held for Sleep's staging (allocator/staging.h), also
  // while awake; only .all is used. As PyTorch's host allocator counts it.
  StatArray host_staging_bytes;
  // Oversubscription: managed memory this allocator placed on the host, for
  // the device to read and write over the link (only .all is used).
  StatArray host_resident_bytes;
  // The away state (allocator/away.cc): bytes of live allocations whose
  // pages wait on the host (not in reserved_bytes), by size class.
  StatArray away_bytes;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_cross_stream_reuse = 0;
  // Managed-memory placement.
  std::int64_t prefetch_calls = 0;
  std::int64_t prefetched_bytes_to_device = 0;
  std::int64_t prefetched_bytes_to_host = 0;
  std::int64_t advise_calls = 0;
  std::int64_t discarded_bytes = 0;
  std::int64_t moves = 0;
  std::int64_t num_placement_errors = 0;  // failed prefetch/advise/discard (hints only)
  std::int64_t managed_budget_bytes = 0;
  // Arena mode: address space reserved (costs nothing physical), idle
  // populated bytes (wholly free pages still populated), and page discards.
  std::int64_t virtual_bytes = 0;
  std::int64_t idle_populated_bytes = 0;
  // The most device pages in use at once (live blocks and the edge pages
  // they share, not the idle cache) since the last ResetPeakStats, in bytes:
  // what the work so far needed of the device's part (arena mode; 0 in
  // classic mode).
  std::int64_t peak_live_device_bytes = 0;
  std::int64_t num_pages_populated = 0;
  std::int64_t num_pages_discarded = 0;
  std::int64_t discard_calls = 0;
  // learn_step:1: bytes booked as given back (in num_pages_discarded and
  // discarded_bytes) whose discard was not made: their pages stay
  // physically held until the driver evicts them or a release the user asks
  // for discards them (DeviceAllocator::DiscardDead).
  std::int64_t kept_dead_bytes = 0;
  std::int64_t num_discard_waits = 0;  // populations ordered after another stream's discard
  // Bytes Sleep copied into staging, and Wake or Move copied back.
  std::int64_t sleep_staged_bytes = 0;
  std::int64_t sleep_restored_bytes = 0;
  // Wakes (or Moves of a sleeping allocation) whose population was ordered
  // after the driver's work behind a Sleep's discards (wake_fence).
  std::int64_t num_wake_fences = 0;
  // Oversubscription: the host part of the budget, and allocations placed
  // on the host (new or reused) because the device's part was full or the
  // caller routed them there.
  std::int64_t host_budget_bytes = 0;
  std::int64_t num_host_placements = 0;
  // Bytes requested by the placements on the host made because the
  // device's part was full (not routed there): what a repeating workload
  // would need to make room for (cma.torch's activation offload learns
  // from it).
  std::int64_t host_overflow_bytes = 0;
  // Bytes SendAway sent to the host and BringBack brought back (a Move or
  // Sleep of an away allocation counts it back without a transfer).
  std::int64_t sent_away_bytes = 0;
  std::int64_t brought_back_bytes = 0;
  // learn_step:1 (allocator/learned_schedule.h): steps ended, plans made,
  // replays a differing event ended, bring-backs the budget had no room for.
  std::int64_t learned_steps = 0;
  std::int64_t learned_plans = 0;
  std::int64_t learned_divergences = 0;
  std::int64_t learned_misses = 0;
  // Microseconds the thread reporting the step's events spent issuing the
  // learned sends and bring-backs.
  std::int64_t learned_send_host_us = 0;
  std::int64_t learned_bring_host_us = 0;
  // Of which making room for them, and the driver's transfer calls alone.
  std::int64_t learned_room_host_us = 0;
  std::int64_t learned_send_call_host_us = 0;
  std::int64_t learned_bring_call_host_us = 0;

  // Flattened as PyTorch does: "allocated_bytes.all.current", "num_ooms", ...
  std::map<std::string, std::int64_t> Flatten() const;
  // Sum of two devices' stats (peaks add, which bounds the true joint peak).
  DeviceStats& operator+=(const DeviceStats& o);
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_STATS_H_
