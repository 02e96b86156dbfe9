#include "policy/release_policy.h"

#include <algorithm>

namespace cma {

std::size_t ReleaseBeforeGrowth(const AllocatorConfig& config, std::size_t reserved,
                                std::size_t peak_reserved, std::size_t new_segment,
                                std::size_t budget) {
  std::size_t release = 0;
  if (config.release_before_peak && reserved + new_segment > peak_reserved) release = new_segment;
  if (config.garbage_collection_threshold > 0) {
    const auto mark = static_cast<std::size_t>(config.garbage_collection_threshold *
                                               static_cast<double>(budget));
    if (reserved + new_segment > mark) release = std::max(release, reserved + new_segment - mark);
  }
  return release;
}

std::size_t ReleaseAfterFree(const AllocatorConfig& config, std::size_t reserved,
                             std::size_t active) {
  const std::size_t idle = reserved - active;
  return idle > config.release_threshold ? idle - config.release_threshold : 0;
}

std::size_t IdlePagesToDiscard(const AllocatorConfig& config, std::size_t populated_pages,
                               std::size_t idle_pages, std::size_t new_pages,
                               std::size_t live_after, std::size_t peak_live,
                               std::size_t budget_pages) {
  std::size_t limit = budget_pages;  // off: only the budget asks
  if (config.idle_page_slack >= 0) {
    const std::size_t peak = std::max(peak_live, live_after);
    const std::size_t slack =
        config.idle_page_slack == 0
            ? 0
            : std::max(kMinSlackPages, static_cast<std::size_t>(config.idle_page_slack *
                                                                static_cast<double>(peak)));
    limit = std::min(peak + slack, budget_pages);
  }
  if (config.garbage_collection_threshold > 0) {
    // Growth past the mark first gives idle pages back, down to the mark.
    limit = std::min(limit, static_cast<std::size_t>(config.garbage_collection_threshold *
                                                     static_cast<double>(budget_pages)));
  }
  const std::size_t after = populated_pages + new_pages;
  return after > limit ? std::min(idle_pages, after - limit) : 0;
}

}  // namespace cma
