// The page arithmetic of a Sleep (allocator/sleep.cc): which bytes of an
// allocation may leave the device together with the whole 2 MiB pages
// they sit on, which pages a Sleep may discard, and how staged contents
// come back.
//
// A discard takes whole pages. A page an allocation shares with others
// (its partial edge pages) may go too when every other byte on it is free
// (outside a private pool) or leaves as well (staged or thrown away); then
// the allocation's bytes there are staged exactly and the page discarded,
// rather than migrated at the speed of host page population. Anything else on the page (an
// allocation that stays or migrates, a block whose frees still wait for
// other streams, memory outside the segment) keeps the page in place.
//
// Internal to allocator/; pure functions over blocks the caller guards
// (the owning DeviceAllocator's mutex held).
#ifndef CMA_ALLOCATOR_SLEEP_PLAN_H_
#define CMA_ALLOCATOR_SLEEP_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "allocator/block.h"
#include "backends/backend.h"

namespace cma {

// How an allocation's contents leave the device in a Sleep.
enum class Leave {
  kStage,  // copied into the pinned staging, then discarded
  kDrop,   // discarded (disposable, or not kept at level 2)
};
using LeaveRoles = absl::flat_hash_map<const Block*, Leave>;

// The part of `b` (which has a role) that leaves with whole pages: from its
// start, or from its first page boundary when its first page must stay; to
// its end, or to its last page boundary likewise. Empty (bytes 0) when no
// page of it may go. The rest of `b` stays and migrates.
Range LeavingPart(const Block* b, const LeaveRoles& roles);

// The free blocks that share a page with `part` (the leaving part of `b`):
// a discard of those pages is queued on the sleeping stream, so the
// streams they would next be used on must wait for it.
void FreeNeighboursOnPages(const Block* b, const Range& part, std::vector<Block*>* out);

// The whole pages under `parts` (page-rounded, merged), less every page
// that any of `stays` touches; sorted, disjoint. Ranges may span segments
// that lie back to back: the caller splits them (SplitAtSegments).
std::vector<Range> PagesToDiscard(absl::Span<const Range> parts, absl::Span<const Range> stays);

// Whether [lo, hi) overlaps any of `sorted` (sorted by address, disjoint).
bool OverlapsAny(absl::Span<const Range> sorted, std::uintptr_t lo, std::uintptr_t hi);

// One allocation's staged bytes: where they live and where in the staging.
struct StagedPart {
  Range bytes;
  std::size_t offset;
  const Segment* segment;  // ranges of two segments never merge (two managed ranges)
};

// How staged parts come back: their pages populated at the target (pages
// the parts cover wholly may be discarded first: the copies overwrite all
// of them; the others hold other data and are only prefetched), then the
// bytes copied back, adjacent parts in one copy.
struct RestorePlan {
  std::vector<Range> repopulate;  // whole pages only the copies write
  std::vector<Range> prefetch;    // pages shared with bytes not restored here
  std::vector<StagedPart> copies;  // merged where adjacent in both spaces
  std::size_t bytes = 0;
};
RestorePlan PlanRestore(std::vector<StagedPart> parts);

}  // namespace cma

#endif  // CMA_ALLOCATOR_SLEEP_PLAN_H_
