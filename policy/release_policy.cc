#include "policy/release_policy.h"

namespace cma {

std::size_t ReleaseBeforeGrowth(const AllocatorConfig& config, std::size_t reserved,
                                std::size_t peak_reserved, std::size_t new_segment) {
  if (!config.release_before_peak) return 0;
  if (reserved + new_segment <= peak_reserved) return 0;
  return new_segment;
}

}  // namespace cma
