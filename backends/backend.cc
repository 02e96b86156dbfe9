#include "backends/backend.h"

#include "absl/strings/str_cat.h"

namespace cma {

std::string LocationName(const Location& l) {
  return l.is_host() ? std::string("host") : absl::StrCat("device ", l.device);
}

const char* AdviceName(Advice a) {
  switch (a) {
    case Advice::kSetReadMostly: return "set_read_mostly";
    case Advice::kUnsetReadMostly: return "unset_read_mostly";
    case Advice::kSetPreferredLocation: return "set_preferred_location";
    case Advice::kUnsetPreferredLocation: return "unset_preferred_location";
    case Advice::kSetAccessedBy: return "set_accessed_by";
    case Advice::kUnsetAccessedBy: return "unset_accessed_by";
    case Advice::kSetCoarseGrain: return "set_coarse_grain";
    case Advice::kUnsetCoarseGrain: return "unset_coarse_grain";
  }
  return "unknown";
}

}  // namespace cma
