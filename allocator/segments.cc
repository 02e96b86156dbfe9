// DeviceAllocator's new segments (allocator/device_allocator.h): an arena
// or a classic segment from the backend, or a private pool's segment from
// its SegmentSource (allocator/segment_source.h), checked and counted.
#include <cstdint>
#include <iterator>
#include <memory>

#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"
#include "allocator/format.h"
#include "policy/size_policy.h"

namespace cma {

absl::StatusOr<Block*> DeviceAllocator::NewSegment(std::size_t rounded, PoolKind pool,
                                                   Stream stream) {
  if (arena_mode()) return NewArena(rounded, pool, stream);
  return NewClassicSegment(SegmentSizeFor(rounded), pool, stream);
}

absl::StatusOr<Block*> DeviceAllocator::NewClassicSegment(std::size_t size, PoolKind pool,
                                                          Stream stream, std::uint32_t mempool) {
  auto owner = mempool == 0 ? mempools_.end() : mempools_.find(mempool);
  const std::shared_ptr<SegmentSource> source =
      owner == mempools_.end() ? nullptr : owner->second.source;
  const std::size_t reserved = static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current);
  if (reserved + size > budget_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a new %s segment would exceed the managed budget of device %d (%s reserved of %s)",
        FormatBytes(size), device_, FormatBytes(reserved), FormatBytes(budget_)));
  }
  absl::StatusOr<void*> mem = source == nullptr ? backend_->AllocateManaged(device_, size)
                                                : source->Allocate(device_, size, stream);
  if (!mem.ok()) return mem.status();
  if (source != nullptr) {
    if (absl::Status s = CheckSourcedRange(*mem, size); !s.ok()) {
      // Given back unless it overlaps a segment held: the source may have
      // handed out memory it still counts as ours, which its free would take.
      if (*mem != nullptr && !absl::IsAlreadyExists(s)) (void)source->Free(device_, *mem, size);
      return absl::InternalError(s.message());
    }
  }
  Block* b = AddSegment(*mem, size, pool, stream);
  UpdateStat(stats_.reserved_bytes, pool, size);
  if (owner != mempools_.end()) {
    b->segment->owner_pool = mempool;
    ++owner->second.segments;
  }
  if (source != nullptr) {
    b->segment->source = source;  // another allocator's memory: nothing to advise or place
  } else if (quiet()) {
    unadvised_.push_back(b->segment->base);  // advised when the last pool context ends
  } else {
    PrepareSegment(b, stream);
  }
  return b;
}

absl::Status DeviceAllocator::CheckSourcedRange(void* mem, std::size_t size) const {
  const auto lo = reinterpret_cast<std::uintptr_t>(mem);
  // Blocks are aligned within their segment; 256 bytes is what cudaMalloc
  // and the allocators built on it promise.
  if (lo == 0 || lo % 256 != 0 || lo > UINTPTR_MAX - size) {
    return absl::InternalError(absl::StrFormat(
        "cma: a pool's own allocator returned %p for %d bytes: not a 256-byte aligned range", mem,
        size));
  }
  auto next = segments_.lower_bound(lo);
  const bool overlaps_next = next != segments_.end() && next->first < lo + size;
  const bool overlaps_prev =
      next != segments_.begin() && std::prev(next)->second->base + std::prev(next)->second->size > lo;
  if (overlaps_next || overlaps_prev) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "cma: a pool's own allocator returned %p for %d bytes, which overlaps a segment device "
        "%d holds (kept, not given back)",
        mem, size, device_));
  }
  return absl::OkStatus();
}

Block* DeviceAllocator::AddSegment(void* mem, std::size_t size, PoolKind pool, Stream stream) {
  auto* seg = new Segment;
  seg->base = reinterpret_cast<std::uintptr_t>(mem);
  seg->size = size;
  seg->pool = pool;
  Block* b = NewBlock();
  b->addr = seg->base;
  b->size = size;
  b->stream = stream;
  b->segment = seg;
  seg->first = b;
  segments_[seg->base] = seg;
  UpdateStat(stats_.segment, pool, 1);
  ++stats_.num_device_alloc;
  return b;
}

}  // namespace cma
