// RoundupDivisions: PyTorch's roundup_power2_divisions, one count per
// power-of-two size interval, with PyTorch's meaning and syntax.
//
// A request above 512 x N bytes, where N is the count of its interval, is
// rounded up to the next 1/N step of its power of two (sizes that are powers
// of two stay as they are); N of 0 or 1 leaves 512-byte rounding. The
// intervals are [0, 2 MiB), [2 MiB, 4 MiB), ... and [32 GiB, inf): sixteen.
// A request of at most 512 x N bytes keeps 512-byte rounding (size_policy.h).
//
// Syntax: "N" (every interval), or "[K:N,K:N,...,>:N]" where K is a size in
// MiB, a power of two, naming the interval [K MiB, 2K MiB) (1 names the
// first, which also holds every size below 1 MiB; 32768 and above name the
// last); the first K's count also covers every interval below it, and ">"
// covers the last named interval and every one above it. Counts are 0 or a
// power of two up to 32768.
//
// A value type: no locks, no backend calls.
#ifndef CMA_POLICY_ROUNDUP_DIVISIONS_H_
#define CMA_POLICY_ROUNDUP_DIVISIONS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cma {

class RoundupDivisions {
 public:
  static constexpr int kIntervals = 16;

  RoundupDivisions() = default;  // every count 0: plain 512-byte rounding
  static RoundupDivisions Uniform(int n);

  // Parses either syntax. Errors name the offending part; the message does
  // not name the key (the caller does).
  static absl::StatusOr<RoundupDivisions> Parse(absl::string_view text);

  // The count for requests of `bytes`.
  int For(std::size_t bytes) const { return by_interval_[IntervalOf(bytes)]; }
  // "N" when every interval has the same count, else the bracketed form
  // naming every interval; Parse(ToString()) gives this value back.
  std::string ToString() const;

  friend bool operator==(const RoundupDivisions& a, const RoundupDivisions& b) {
    return a.by_interval_ == b.by_interval_;
  }
  friend bool operator!=(const RoundupDivisions& a, const RoundupDivisions& b) {
    return !(a == b);
  }

 private:
  static int IntervalOf(std::size_t bytes);
  std::array<std::uint16_t, kIntervals> by_interval_{};
};

}  // namespace cma

#endif  // CMA_POLICY_ROUNDUP_DIVISIONS_H_
