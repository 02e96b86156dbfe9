// When cached memory goes back to the backend.
//
// Pure functions of their arguments: no locks, no backend calls.
#ifndef CMA_POLICY_RELEASE_POLICY_H_
#define CMA_POLICY_RELEASE_POLICY_H_

#include <cstddef>

#include "policy/config.h"

namespace cma {

// Bytes of idle cached segments to release before carving a new segment of
// `new_segment` bytes. With release_before_peak (opt-in) the allocator
// never raises its high-water mark of reserved memory while idle segments
// could be given back instead; below the mark it keeps its cache, so a steady
// state makes no backend call. Returns 0 for "release nothing".
// With garbage_collection_threshold t, growth past t x budget also first
// releases idle segments down to that mark.
std::size_t ReleaseBeforeGrowth(const AllocatorConfig& config, std::size_t reserved,
                                std::size_t peak_reserved, std::size_t new_segment,
                                std::size_t budget);

// Bytes of idle cache to release after a free: what exceeds release_threshold
// (0 when under it or when no threshold is set).
std::size_t ReleaseAfterFree(const AllocatorConfig& config, std::size_t reserved,
                             std::size_t active);

// Arena mode: how many wholly free but populated ("idle") pages to discard
// before `new_pages` pages are populated, when the allocation will leave
// `live_after` pages in use and the most ever in use was `peak_live`.
// By default (idle_page_slack off) only the budget asks for discards. With a
// slack, populated pages may exceed the peak of pages in use by that
// fraction of it (at least kMinSlackPages), so a repeating workload settles
// with no discard; beyond it, idle pages make way for new ones, which keeps
// the populated high-water mark at the peak in use. With
// garbage_collection_threshold t, populating past t x budget first discards
// idle pages down to that mark. Never more than `idle_pages`.
inline constexpr std::size_t kMinSlackPages = 4;
std::size_t IdlePagesToDiscard(const AllocatorConfig& config, std::size_t populated_pages,
                               std::size_t idle_pages, std::size_t new_pages,
                               std::size_t live_after, std::size_t peak_live,
                               std::size_t budget_pages);

}  // namespace cma

#endif  // CMA_POLICY_RELEASE_POLICY_H_
