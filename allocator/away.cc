// DeviceAllocator's away state (issue 48): a live allocation whose pages
// wait on the host while the step does not need them, so that the device's
// part holds what the step uses next.
//
// Only the pages strictly inside a block move: its first and last page may
// hold a neighbour's data, and a neighbour's allocation or free touches them
// (page_map.h counts their users), so they stay where they are and counted.
// An allocation spanning fewer than three pages has nothing to send.
//
// The page map counts an away block's inner pages as unpopulated, so
// reserved_bytes drops by them and the budget has room for other
// allocations; away_bytes counts them. Managed memory stays coherent: a
// kernel that touches an away block migrates its pages back on demand
// (correct, slower, and not counted until BringBack), so a schedule decides
// speed, never results.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "allocator/device_allocator.h"
#include "allocator/format.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

// [lo, hi): the pages SendAway moves.
std::pair<std::size_t, std::size_t> InnerPages(const Block& b) {
  const Segment* seg = b.segment;
  const std::size_t first = seg->PageOf(b.addr), last = seg->PageOf(b.addr + b.size - 1);
  return {first + 1, std::max(first + 1, last)};
}

Range InnerRange(const Block& b) {
  const auto [lo, hi] = InnerPages(b);
  return {reinterpret_cast<void*>(b.segment->base + lo * kPageSize), (hi - lo) * kPageSize};
}

}  // namespace

absl::Status DeviceAllocator::Awayable(const Block& b) {
  const Segment* seg = b.segment;
  if (seg->host_tier) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: %p lives on the host already (oversubscription's host tier)", b.ptr()));
  }
  if (seg->source != nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: %p is memory of a pool's own allocator, not managed memory: it cannot be away",
        b.ptr()));
  }
  if (b.mempool != 0) {
    // A CUDA graph replays into a private pool's blocks, and a pool's
    // checkpoint restores them in place: they stay put.
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: %p belongs to a private pool (a MemPool or a CUDA graph's): it cannot be away",
        b.ptr()));
  }
  if (!seg->arena) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: %p lies in a classic segment: the away state needs segments:arena", b.ptr()));
  }
  if (b.pages_discarded || staged_.contains(b.addr)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: %p was left by a Sleep and not woken: Wake or Move it first", b.ptr()));
  }
  return absl::OkStatus();
}

absl::Status DeviceAllocator::SetAway(absl::Span<void* const> ptrs, bool away, Stream stream,
                                      bool check_only) {
  MutexLock l(&mu_);
  const char* what = away ? "send_away" : "bring_back";
  if (absl::Status s = RefuseWhileQuiet(what); !s.ok()) return s;
  DrainLearnedTransfers();
  std::vector<Block*> blocks;
  blocks.reserve(ptrs.size());
  for (void* p : ptrs) {
    auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == allocated_.end()) return NotMine();
    Block* b = it->second;
    if (absl::Status s = Awayable(*b); !s.ok()) return s;
    // Already in the state asked for, or nothing inside to move: no-ops.
    if (b->away == away) continue;
    if (InnerPages(*b).first == InnerPages(*b).second) continue;
    blocks.push_back(b);
  }
  if (absl::Status s = CheckStream(stream); !s.ok()) return s;
  // A pointer named twice (tied weights) moves once.
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  if (!away) {
    if (absl::Status s = CheckRoomToBringBack(blocks); !s.ok()) return s;
  }
  if (check_only || blocks.empty()) return absl::OkStatus();
  // After the work on each allocation's own stream too: its pages may have
  // been discarded there before it was handed out, and a transfer on
  // another stream must not populate them first.
  absl::flat_hash_set<Stream> owners;
  for (const Block* b : blocks) {
    if (b->stream != stream) owners.insert(b->stream);
  }
  for (Stream owner : owners) {
    if (absl::Status w = OrderAfter(stream, owner); !w.ok()) {
      return absl::Status(w.code(), absl::StrFormat("cma: %s could not order after stream %#x: %s",
                                                    what, owner, w.message()));
    }
  }
  return MoveAway(blocks, away, stream);
}

std::size_t DeviceAllocator::InnerPageCount(absl::Span<Block* const> blocks) const {
  std::size_t pages = 0;
  for (const Block* b : blocks) {
    const auto [lo, hi] = InnerPages(*b);
    pages += hi - lo;
  }
  return pages;
}

absl::Status DeviceAllocator::CheckRoomToBringBack(absl::Span<Block* const> blocks) {
  const std::size_t pages = InnerPageCount(blocks);
  // (A captured pool's idle pages are never discarded: they count as in use.)
  const std::size_t in_use = populated_pages() - (idle_pages_ - pinned_idle_pages_);
  if (pages != 0 && in_use + pages > budget_ / kPageSize) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cma: bringing back %s would exceed the managed budget of device %d (%s in use of %s); "
        "send something away first",
        FormatBytes(pages * kPageSize), device_,
        FormatBytes(in_use * kPageSize), FormatBytes(budget_)));
  }
  return absl::OkStatus();
}

void DeviceAllocator::MakeRoomToBringBack(std::size_t pages, Stream stream) {
  const std::size_t budget_pages = budget_ / kPageSize;
  if (populated_pages() + pages <= budget_pages) return;
  // Idle cached pages make the room, discarded ahead of the population on
  // `stream` (DiscardIdlePages orders it after other streams' discards, and
  // a page that free blocks of several streams share after those streams,
  // all on the GPU: a host wait here would stall the thread that launches
  // the step's kernels at every bring back).
  DiscardIdlePages(populated_pages() + pages - budget_pages, 0, 0, &stream);
}

absl::Status DeviceAllocator::MoveAway(absl::Span<Block* const> blocks, bool away, Stream stream) {
  const char* what = away ? "send_away" : "bring_back";
  const std::size_t pages = InnerPageCount(blocks);
  const std::size_t budget_pages = budget_ / kPageSize;
  if (!away) {
    const absl::Time t0 = absl::Now();
    MakeRoomToBringBack(pages, stream);
    if (learn_ != nullptr) learn_->room_host_us += absl::ToInt64Microseconds(absl::Now() - t0);
    if (populated_pages() + pages > budget_pages) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cma: bringing back %s: the idle pages of device %d could not all be discarded",
          FormatBytes(pages * kPageSize), device_));
    }
  }
  std::vector<Range> ranges;
  ranges.reserve(blocks.size());
  for (const Block* b : blocks) ranges.push_back(InnerRange(*b));
  const Location target = away ? Location::Host() : Location::Device(device_);
  const absl::Time t0 = absl::Now();
  // The learned step's bring-backs go through its transfer thread, if any.
  TransferThread* via = !away && learn_ != nullptr && learn_->mover != nullptr &&
                                stream == learn_->back_stream
                            ? learn_->mover.get()
                            : nullptr;
  std::uint64_t ticket = 0;
  absl::Status moved = Execute(PlacementAction::kPrefetch, ranges, target, stream, via, &ticket);
  if (via != nullptr) {
    std::vector<std::uintptr_t>& carried = learn_->bring_calls[ticket];
    for (const Block* b : blocks) carried.push_back(b->addr);
  }
  if (learn_ != nullptr) {
    (away ? learn_->send_call_host_us : learn_->bring_call_host_us) +=
        absl::ToInt64Microseconds(absl::Now() - t0);
  }
  if (!moved.ok()) {
    return absl::Status(moved.code(), absl::StrFormat("cma: %s failed: %s", what, moved.message()));
  }
  for (Block* b : blocks) {
    Segment* seg = b->segment;
    const auto [lo, hi] = InnerPages(*b);
    const auto bytes = static_cast<std::int64_t>((hi - lo) * kPageSize);
    if (away) {
      CountAway(b);
      stats_.sent_away_bytes += bytes;
    } else {
      const bool by_small = b->size_class == PoolKind::kSmall;
      for (std::size_t p = lo; p < hi; ++p) seg->pages.set_populated(p, by_small);
      UpdateStat(stats_.reserved_bytes, b->size_class, bytes);
      UpdateStat(stats_.away_bytes, b->size_class, -bytes);
      stats_.num_pages_populated += static_cast<std::int64_t>(hi - lo);
      stats_.brought_back_bytes += bytes;
    }
    // (placed/location stay the block's: its first and last pages did not
    // move, and a Wake or Move reads them.)
    b->away = away;
    // Its free waits for this transfer as for any use by `stream`.
    if (stream != b->stream &&
        std::find(b->stream_uses.begin(), b->stream_uses.end(), stream) == b->stream_uses.end()) {
      b->stream_uses.push_back(stream);
    }
  }
  NoteLivePages();
  return absl::OkStatus();
}

void DeviceAllocator::CountAway(Block* b) {
  Segment* seg = b->segment;
  const auto [lo, hi] = InnerPages(*b);
  const auto bytes = static_cast<std::int64_t>((hi - lo) * kPageSize);
  std::int64_t small = 0;
  for (std::size_t p = lo; p < hi; ++p) small += seg->pages.small(p);
  for (std::size_t p = lo; p < hi; ++p) seg->pages.clear_populated(p);
  UpdateStat(stats_.reserved_bytes, PoolKind::kSmall, -small * kPageSize);
  UpdateStat(stats_.reserved_bytes, PoolKind::kLarge, small * kPageSize - bytes);
  UpdateStat(stats_.away_bytes, b->size_class, bytes);
  b->away = true;
}

bool DeviceAllocator::CanBeAway(const Block& b) {
  return Awayable(b).ok() && InnerPages(b).first != InnerPages(b).second;
}

void DeviceAllocator::CountBack(Block* b) {
  if (!b->away) return;
  Segment* seg = b->segment;
  const auto [lo, hi] = InnerPages(*b);
  const bool by_small = b->size_class == PoolKind::kSmall;
  for (std::size_t p = lo; p < hi; ++p) seg->pages.set_populated(p, by_small);
  const auto bytes = static_cast<std::int64_t>((hi - lo) * kPageSize);
  UpdateStat(stats_.reserved_bytes, b->size_class, bytes);
  UpdateStat(stats_.away_bytes, b->size_class, -bytes);
  b->away = false;
  NoteLivePages();
}

std::vector<Range> DeviceAllocator::CountBackAll() {
  std::vector<Range> inner;
  if (stats_.away_bytes[kAllPools].current == 0) return inner;
  for (auto& [addr, b] : allocated_) {
    if (!b->away) continue;
    inner.push_back(InnerRange(*b));
    CountBack(b);
  }
  return inner;
}

void DeviceAllocator::ForgetAway(Block* b) {
  const auto [lo, hi] = InnerPages(*b);
  const auto bytes = static_cast<std::int64_t>((hi - lo) * kPageSize);
  UpdateStat(stats_.away_bytes, b->size_class, -bytes);
  b->away = false;
  // Dead data on the host: dropped, so that whoever populates these pages
  // next does not migrate it back. Ordered after the block's last use on
  // its stream (other streams' uses have completed by now). A failed
  // discard costs a migration later, never a wrong result.
  const Range r = InnerRange(*b);
  if (absl::StatusOr<bool> d = DiscardDead({&r, 1}, b->stream); !d.ok()) {
    NotePlacementError(d.status());
  } else if (*d) {
    ++stats_.discard_calls;
    stats_.discarded_bytes += bytes;
  }
}

}  // namespace cma
