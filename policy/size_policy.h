// Size classes and rounding: which pool a request goes to, how much is carved
// from the backend for it, and when a cached block may be split or reused.
//
// Pure functions of their arguments: no locks, no backend calls.
#ifndef CMA_POLICY_SIZE_POLICY_H_
#define CMA_POLICY_SIZE_POLICY_H_

#include <cstddef>

#include "policy/config.h"

namespace cma {

inline constexpr std::size_t kMinBlockSize = 512;              // every size rounds to this
inline constexpr std::size_t kSmallSize = std::size_t{1} << 20;  // small pool: <= 1 MiB
inline constexpr std::size_t kSmallSegment = std::size_t{2} << 20;
inline constexpr std::size_t kLargeSegment = std::size_t{20} << 20;
inline constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
inline constexpr std::size_t kLargeRounding = std::size_t{2} << 20;
// Arena mode: the physical unit, populated and discarded whole.
inline constexpr std::size_t kPageSize = std::size_t{2} << 20;

enum class PoolKind { kSmall = 0, kLarge = 1 };

// The size a request is rounded to before any pool lookup.
std::size_t RoundRequest(std::size_t bytes, const AllocatorConfig& config);

// The size class of a rounded request: what the per-pool statistics of its
// allocation count it under.
inline PoolKind PoolFor(std::size_t rounded) {
  return rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge;
}

// Where a rounded request is looked up and carved from. Classic segments
// keep small and large blocks apart, as PyTorch does. Arena mode carves every
// size from one arena (the large pool's): small blocks then fill the pages
// that large ones leave partly used, instead of populating pages of their
// own (measured on the replay traces: 57 fewer pages at the BERT loop's peak,
// and lower on the other two).
inline PoolKind BlockPoolFor(std::size_t rounded, const AllocatorConfig& config) {
  return config.segments == SegmentMode::kArena ? PoolKind::kLarge : PoolFor(rounded);
}

// Where a rounded request is looked up: in a private pool's own segments
// (`private_pool`), which keep PyTorch's kinds in arena mode too, so that
// their segments and statistics are native's; else as BlockPoolFor.
inline PoolKind LookupPoolFor(std::size_t rounded, bool private_pool,
                              const AllocatorConfig& config) {
  return private_pool ? PoolFor(rounded) : BlockPoolFor(rounded, config);
}

// The size of a new segment carved from the backend for a rounded request.
std::size_t SegmentSizeFor(std::size_t rounded);

// Whether a cached free block of `block_size` may be handed out for a
// rounded request of `rounded` bytes: blocks at least max_split_size long are
// only reused for requests that waste little of them (classic segments only:
// in an arena, splitting costs nothing physical, since wholly free pages are
// given back).
bool CanServe(std::size_t block_size, std::size_t rounded, const AllocatorConfig& config);

// Whether serving `rounded` bytes from a block of `block_size` should split
// off the remainder as a new free block (always, in an arena).
bool ShouldSplit(std::size_t block_size, std::size_t rounded, PoolKind pool,
                 const AllocatorConfig& config);

}  // namespace cma

#endif  // CMA_POLICY_SIZE_POLICY_H_
