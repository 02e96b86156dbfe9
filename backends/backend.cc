#include "backends/backend.h"

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
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

absl::StatusOr<MemInfo> Backend::GetHostMemInfo() {
  std::ifstream in("/proc/meminfo");
  MemInfo m;
  bool available = false, total = false;
  std::string key, unit;
  std::size_t kib = 0;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemAvailable:") {
      m.free_bytes = kib << 10;
      available = true;
    } else if (key == "MemTotal:") {
      m.total_bytes = kib << 10;
      total = true;
    }
  }
  if (!available || !total) {
    return absl::UnavailableError("cma: cannot read the host's memory from /proc/meminfo");
  }
  return m;
}

absl::StatusOr<CommFacts> Backend::GetCommFacts(CommHandle) {
  return absl::UnimplementedError(absl::StrCat(
      name(), " backend: no collective library (NCCL) for communicator windows"));
}

}  // namespace cma
