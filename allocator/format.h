// Human-readable byte counts for error messages ("1.50 GiB").
#ifndef CMA_ALLOCATOR_FORMAT_H_
#define CMA_ALLOCATOR_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"

namespace cma {

inline std::string FormatBytes(std::uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%d B", n) : absl::StrFormat("%.2f %s", v, kUnits[u]);
}

}  // namespace cma

#endif  // CMA_ALLOCATOR_FORMAT_H_
