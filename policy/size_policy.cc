#include "policy/size_policy.h"

namespace cma {
namespace {

std::size_t RoundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

int FloorLog2(std::size_t n) { return 63 - __builtin_clzll(n); }

}  // namespace

std::size_t RoundRequest(std::size_t bytes, const AllocatorConfig& config) {
  if (bytes <= kMinBlockSize) return kMinBlockSize;
  const std::size_t div = static_cast<std::size_t>(config.roundup_power2_divisions.For(bytes));
  // PyTorch's rule: above 512 x div bytes, the next 1/div step of the size's
  // power of two (a step of at least 512 bytes, since div is a power of two).
  if (div > 1 && bytes > kMinBlockSize * div) {
    const std::size_t floor_pow2 = std::size_t{1} << FloorLog2(bytes);
    if (floor_pow2 == bytes) return bytes;
    return RoundUp(bytes, floor_pow2 / div);
  }
  return RoundUp(bytes, kMinBlockSize);
}

std::size_t SegmentSizeFor(std::size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return RoundUp(rounded, kLargeRounding);
}

bool CanServe(std::size_t block_size, std::size_t rounded, const AllocatorConfig& config) {
  if (block_size < rounded) return false;
  if (config.segments == SegmentMode::kArena) return true;
  if (rounded < config.max_split_size && block_size >= config.max_split_size) return false;
  if (rounded >= config.max_split_size && block_size >= rounded + kLargeSegment) return false;
  return true;
}

bool ShouldSplit(std::size_t block_size, std::size_t rounded, PoolKind pool,
                 const AllocatorConfig& config) {
  const std::size_t remaining = block_size - rounded;
  if (config.segments == SegmentMode::kArena) return remaining >= kMinBlockSize;
  if (pool == PoolKind::kSmall) return remaining >= kMinBlockSize;
  return rounded < config.max_split_size && remaining > kSmallSize;
}

}  // namespace cma
