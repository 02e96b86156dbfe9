// DeviceAllocator::CheckInvariants: a full recount of the allocator's state,
// run by tests after every step of randomized workloads.
#include <algorithm>

#include "backends/mutex_lock.h"
#include "absl/container/flat_hash_map.h"

#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"

namespace cma {
namespace {

absl::Status Broken(const std::string& what) {
  return absl::InternalError("cma invariant violated: " + what);
}

struct Recount {
  std::int64_t count[2] = {0, 0};
  std::int64_t bytes[2] = {0, 0};
  void Add(PoolKind p, std::int64_t b) {
    ++count[static_cast<int>(p)];
    bytes[static_cast<int>(p)] += b;
  }
};

absl::Status Compare(const char* name, const StatArray& s, const std::int64_t (&v)[2]) {
  if (s[kSmallPool].current != v[0] || s[kLargePool].current != v[1] ||
      s[kAllPools].current != v[0] + v[1]) {
    return Broken(absl::StrFormat("stat %s is %d/%d/%d (all/small/large), recount %d/%d/%d", name,
                                  s[kAllPools].current, s[kSmallPool].current,
                                  s[kLargePool].current, v[0] + v[1], v[0], v[1]));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DeviceAllocator::CheckArenaPages(const Segment* seg, std::size_t* idle_pages) {
  const std::size_t n = seg->size / kPageSize;
  if (seg->pages.size() != n) {
    return Broken(absl::StrFormat("arena %#x page map does not match its size", seg->base));
  }
  // Recount: edge users from every block in use, and which pages it uses.
  std::vector<std::uint32_t> edges(n, 0);
  std::vector<bool> used(n, false);
  std::vector<bool> away(n, false);  // inner pages of away blocks
  for (const Block* b = seg->first; b != nullptr; b = b->next) {
    if (b->away && b->is_free()) {
      return Broken(absl::StrFormat("free block %#x is marked away", b->addr));
    }
    if (b->is_free()) continue;
    const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + b->size - 1);
    ++edges[first];
    if (last != first) ++edges[last];
    for (std::size_t p = first; p <= last; ++p) used[p] = true;
    if (b->away) {
      for (std::size_t p = first + 1; p < last; ++p) away[p] = true;
    }
  }
  std::size_t populated = 0;
  for (std::size_t p = 0; p < n; ++p) {
    if (edges[p] != seg->pages.edge_users(p)) {
      return Broken(absl::StrFormat("arena %#x page %d has %d edge users, recount %d", seg->base,
                                    p, seg->pages.edge_users(p), edges[p]));
    }
    if (away[p] && seg->pages.populated(p)) {
      return Broken(absl::StrFormat("arena %#x page %d is an away block's but populated",
                                    seg->base, p));
    }
    if (used[p] && !away[p] && !seg->pages.populated(p)) {
      return Broken(absl::StrFormat("arena %#x page %d is in use but not populated", seg->base, p));
    }
    populated += seg->pages.populated(p);
    if (!used[p] && seg->pages.populated(p)) ++*idle_pages;
  }
  if (populated != seg->pages.populated_count() ||
      populated != seg->pages.CountPopulated(0, n)) {
    return Broken(absl::StrFormat("arena %#x counts %d populated pages, recount %d", seg->base,
                                  seg->pages.populated_count(), populated));
  }
  return absl::OkStatus();
}

absl::Status DeviceAllocator::CheckInvariants() {
  MutexLock l(&mu_);
  Recount segments, allocated, requested, active, inactive_split, away_bytes;
  std::size_t idle_pages = 0, pinned_idle_pages = 0;
  std::size_t free_blocks[3] = {0, 0, 0};  // small, large, host tier
  std::int64_t host_bytes = 0;
  std::size_t allocated_blocks = 0;
  std::uintptr_t previous_end = 0;
  absl::flat_hash_map<const Block*, int> pending_count;
  for (const PendingFree& p : pending_) ++pending_count[p.block];
  for (const Block* b : deferred_) {
    if (b->allocated) return Broken(absl::StrFormat("allocated block %#x is among the deferred frees", b->addr));
    ++pending_count[b];  // one event, recorded later
  }
  for (const auto& [b, wait] : capture_frees_) {
    if (std::find(deferred_.begin(), deferred_.end(), b) == deferred_.end()) {
      return Broken(absl::StrFormat("block %#x waits for a capture's joins but is not deferred", b->addr));
    }
  }
  absl::flat_hash_map<std::uint32_t, std::size_t> owned_segments;
  for (auto& [base, seg] : segments_) {
    if (base != seg->base) return Broken("segment map key differs from segment base");
    if (seg->owner_pool != 0) {
      auto owner = mempools_.find(seg->owner_pool);
      if (owner == mempools_.end()) {
        return Broken(absl::StrFormat("segment %#x is pool %d's, which is gone", base,
                                      seg->owner_pool));
      }
      if (owner->second.source != seg->source) {
        return Broken(absl::StrFormat("segment %#x is not from its pool's source", base));
      }
      ++owned_segments[seg->owner_pool];
    } else if (seg->source != nullptr) {
      return Broken(absl::StrFormat("segment %#x of another allocator has no pool", base));
    }
    if (base < previous_end) return Broken(absl::StrFormat("segment %#x overlaps its predecessor", base));
    previous_end = base + seg->size;
    // An arena reserves only its populated pages, each under the size
    // class that populated it; the host tier none (its bytes are counted
    // apart).
    if (seg->arena) {
      const std::size_t small = seg->pages.small_count();
      segments.Add(seg->pool, 0);  // the segment itself
      segments.bytes[static_cast<int>(PoolKind::kSmall)] += static_cast<std::int64_t>(small * kPageSize);
      segments.bytes[static_cast<int>(PoolKind::kLarge)] +=
          static_cast<std::int64_t>((seg->pages.populated_count() - small) * kPageSize);
    } else {
      segments.Add(seg->pool, seg->host_tier ? 0 : seg->size);
    }
    if (seg->host_tier) host_bytes += static_cast<std::int64_t>(seg->size);
    if (seg->arena) {
      const std::size_t before = idle_pages;
      if (absl::Status s = CheckArenaPages(seg, &idle_pages); !s.ok()) return s;
      if (seg->pinned) pinned_idle_pages += idle_pages - before;
      if (seg->pinned != (seg->owner_pool != 0 && PoolPagesPinned(seg->owner_pool))) {
        return Broken(absl::StrFormat("arena %#x pinned %d, its pool's pages pinned %d", base,
                                      seg->pinned, !seg->pinned));
      }
    }
    if (seg->first == nullptr || seg->first->prev != nullptr) {
      return Broken(absl::StrFormat("segment %#x has a bad first block", base));
    }
    std::uintptr_t expect = seg->base;
    for (const Block* b = seg->first; b != nullptr; b = b->next) {
      if (b->segment != seg) return Broken(absl::StrFormat("block %#x names the wrong segment", b->addr));
      if (b->mempool != 0 && !mempools_.contains(b->mempool)) {
        return Broken(absl::StrFormat("block %#x names pool %d, which is gone", b->addr, b->mempool));
      }
      if (b->mempool != seg->owner_pool) {
        return Broken(absl::StrFormat("block %#x is pool %d's, in a segment of pool %d", b->addr,
                                      b->mempool, seg->owner_pool));
      }
      if (b->addr != expect) return Broken(absl::StrFormat("gap or overlap at %#x in segment %#x", expect, base));
      if (b->size == 0) return Broken(absl::StrFormat("empty block at %#x", b->addr));
      if (b->next != nullptr && b->next->prev != b) return Broken(absl::StrFormat("broken links after %#x", b->addr));
      expect += b->size;
      const bool recent = b == RecentOf(seg->pool);
      const bool in_pool = recent || FreeListOf(seg).contains(const_cast<Block*>(b));
      if (b->away) {
        if (!seg->arena || b->mempool != 0) {
          return Broken(absl::StrFormat("block %#x is away outside the shared cache's arenas",
                                        b->addr));
        }
        const std::size_t first = seg->PageOf(b->addr), last = seg->PageOf(b->addr + b->size - 1);
        away_bytes.Add(b->size_class,
                       static_cast<std::int64_t>((std::max(last, first + 1) - first - 1) * kPageSize));
      }
      if (b->allocated) {
        ++allocated_blocks;
        auto it = allocated_.find(b->addr);
        if (it == allocated_.end() || it->second != b) return Broken(absl::StrFormat("allocated block %#x missing from the map", b->addr));
        if (in_pool) return Broken(absl::StrFormat("allocated block %#x is in a free pool", b->addr));
        if (b->pending_events != 0) return Broken("allocated block has pending events");
        allocated.Add(b->size_class, b->size);
        requested.Add(b->size_class, b->requested);
        active.Add(b->size_class, b->size);
      } else if (b->pending_events > 0) {
        if (in_pool) return Broken(absl::StrFormat("block %#x awaiting events is in a pool", b->addr));
        const int n = pending_count[b];
        if (n != b->pending_events) return Broken(absl::StrFormat("block %#x pending count %d, list has %d", b->addr, b->pending_events, n));
        active.Add(b->size_class, b->size);
      } else {
        if (!in_pool) return Broken(absl::StrFormat("free block %#x is not in its pool", b->addr));
        if (b->unmerged && std::find(unmerged_.begin(), unmerged_.end(), b) == unmerged_.end()) {
          return Broken(absl::StrFormat("unmerged block %#x is missing from the list", b->addr));
        }
        ++free_blocks[seg->host_tier ? 2 : static_cast<int>(seg->pool)];
        if (b->is_split()) inactive_split.Add(seg->pool, b->size);
        const auto awaits_merge = [&](const Block* x) { return x->unmerged || x == recent_[0] || x == recent_[1]; };
        if (Mergeable(b->next, b) && !awaits_merge(b) && !awaits_merge(b->next)) {
          return Broken(absl::StrFormat("free neighbours %#x (+%d) and %#x (+%d) of one stream not merged", b->addr, b->size, b->next->addr, b->next->size));
        }
      }
    }
    if (expect != seg->base + seg->size) return Broken(absl::StrFormat("blocks of segment %#x do not add up to its size", base));
  }
  for (const auto& [index, pool] : mempools_) {
    const auto owned = owned_segments.find(index);
    const std::size_t n = owned == owned_segments.end() ? 0 : owned->second;
    if (n != pool.segments) {
      return Broken(absl::StrFormat("pool %d counts %d segments of its own, holds %d", index,
                                    pool.segments, n));
    }
  }
  // Each pool also holds one sentinel.
  if (small_pool_.size() + (recent_[0] != nullptr) != free_blocks[0] + 1 ||
      large_pool_.size() + (recent_[1] != nullptr) != free_blocks[1] + 1) {
    return Broken(absl::StrFormat("pools hold %d/%d blocks, segments have %d/%d free", small_pool_.size(), large_pool_.size(), free_blocks[0], free_blocks[1]));
  }
  if (host_pool_.size() != free_blocks[2] + 1) {
    return Broken(absl::StrFormat("the host pool holds %d blocks, host segments have %d free",
                                  host_pool_.size() - 1, free_blocks[2]));
  }
  if (host_bytes != stats_.host_resident_bytes[kAllPools].current) {
    return Broken(absl::StrFormat("host_resident_bytes %d, host segments hold %d",
                                  stats_.host_resident_bytes[kAllPools].current, host_bytes));
  }
  if (allocated_.size() != allocated_blocks) return Broken("allocation map holds blocks that no segment has");
  for (const PendingFree& p : pending_) {
    if (p.block->allocated || p.block->pending_events <= 0) return Broken("pending list names a block not awaiting events");
  }
  if (idle_pages != idle_pages_ ||
      static_cast<std::int64_t>(idle_pages * kPageSize) != stats_.idle_populated_bytes) {
    return Broken(absl::StrFormat("idle pages: counted %d, recount %d (stat %d bytes)", idle_pages_,
                                  idle_pages, stats_.idle_populated_bytes));
  }
  if (pinned_idle_pages != pinned_idle_pages_) {
    return Broken(absl::StrFormat("pinned idle pages: counted %d, recount %d", pinned_idle_pages_,
                                  pinned_idle_pages));
  }
  if (absl::Status s = Compare("segment", stats_.segment, segments.count); !s.ok()) return s;
  if (absl::Status s = Compare("reserved_bytes", stats_.reserved_bytes, segments.bytes); !s.ok()) return s;
  if (absl::Status s = Compare("allocation", stats_.allocation, allocated.count); !s.ok()) return s;
  if (absl::Status s = Compare("allocated_bytes", stats_.allocated_bytes, allocated.bytes); !s.ok()) return s;
  if (absl::Status s = Compare("requested_bytes", stats_.requested_bytes, requested.bytes); !s.ok()) return s;
  if (absl::Status s = Compare("active", stats_.active, active.count); !s.ok()) return s;
  if (absl::Status s = Compare("active_bytes", stats_.active_bytes, active.bytes); !s.ok()) return s;
  if (absl::Status s = Compare("inactive_split", stats_.inactive_split, inactive_split.count); !s.ok()) return s;
  if (absl::Status s = Compare("away_bytes", stats_.away_bytes, away_bytes.bytes); !s.ok()) return s;
  if (absl::Status s = Compare("inactive_split_bytes", stats_.inactive_split_bytes, inactive_split.bytes); !s.ok()) return s;
  return absl::OkStatus();
}

}  // namespace cma
