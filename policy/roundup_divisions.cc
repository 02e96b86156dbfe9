#include "policy/roundup_divisions.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace cma {
namespace {

constexpr int kFirstIntervalLog2 = 20;  // log2 of 1 MiB: the first interval is below 2 MiB

int FloorLog2(std::size_t n) { return 63 - __builtin_clzll(n); }

bool IsPowerOfTwo(std::size_t n) { return n != 0 && (n & (n - 1)) == 0; }

absl::StatusOr<int> ParseCount(absl::string_view v) {
  int n;
  if (!absl::SimpleAtoi(v, &n) || n < 0 || n > 32768 || (n != 0 && !IsPowerOfTwo(n))) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", v, "' is not a count (0 or a power of two up to 32768)"));
  }
  return n;
}

}  // namespace

RoundupDivisions RoundupDivisions::Uniform(int n) {
  RoundupDivisions d;
  d.by_interval_.fill(static_cast<std::uint16_t>(n));
  return d;
}

int RoundupDivisions::IntervalOf(std::size_t bytes) {
  if (bytes == 0) return 0;
  return std::clamp(FloorLog2(bytes) - kFirstIntervalLog2, 0, kIntervals - 1);
}

absl::StatusOr<RoundupDivisions> RoundupDivisions::Parse(absl::string_view text) {
  const absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty() || t.front() != '[') {
    absl::StatusOr<int> n = ParseCount(t);
    if (!n.ok()) return n.status();
    return Uniform(*n);
  }
  if (t.size() < 2 || t.back() != ']') {
    return absl::InvalidArgumentError(absl::StrCat("'", t, "' lacks its closing ']'"));
  }
  RoundupDivisions d;
  bool first = true;
  int last = 0;
  std::vector<absl::string_view> items = absl::StrSplit(t.substr(1, t.size() - 2), ',');
  // PyTorch reads "[]" (nothing set) and a comma before the ']'.
  if (!items.empty() && absl::StripAsciiWhitespace(items.back()).empty()) items.pop_back();
  for (absl::string_view item : items) {
    item = absl::StripAsciiWhitespace(item);
    const std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "' is not MiB:count"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(kv[0]);
    absl::StatusOr<int> n = ParseCount(absl::StripAsciiWhitespace(kv[1]));
    if (!n.ok()) return n.status();
    const auto count = static_cast<std::uint16_t>(*n);
    if (key == ">") {
      std::fill(d.by_interval_.begin() + last, d.by_interval_.end(), count);
      continue;
    }
    std::size_t mib;
    if (!absl::SimpleAtoi(key, &mib) || !IsPowerOfTwo(mib) || mib > (std::size_t{1} << 40)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", key, "' is not a size in MiB that is a power of two, nor '>'"));
    }
    const int index = std::min(FloorLog2(mib), kIntervals - 1);
    if (first) std::fill(d.by_interval_.begin(), d.by_interval_.begin() + index, count);
    first = false;
    d.by_interval_[index] = count;
    last = index;
  }
  return d;
}

std::string RoundupDivisions::ToString() const {
  if (std::all_of(by_interval_.begin(), by_interval_.end(),
                  [&](std::uint16_t n) { return n == by_interval_[0]; })) {
    return absl::StrCat(static_cast<int>(by_interval_[0]));
  }
  std::vector<std::string> parts;
  for (int i = 0; i < kIntervals; ++i) {
    parts.push_back(absl::StrCat(std::size_t{1} << i, ":", static_cast<int>(by_interval_[i])));
  }
  return absl::StrCat("[", absl::StrJoin(parts, ","), "]");
}

}  // namespace cma
