// The symmetric heap's agreements: Create's round (every process's verdict
// on its arguments; the options the group shares), and the size arithmetic
// and size agreement (Allocate's first round). Every size that reaches the heap is hostile until checked:
// a request whose rounding overflows size_t would give a stride smaller
// than the size handed out (every member's buffer too small, and Put/Get,
// Python's arrays and kernels writing past it), so the stride is computed
// with every step checked, each member checks its own request before the
// round and the group's (derived by every member from every member's
// request, never taken from one) after it, and a granularity a member
// announces must be a power of two no larger than kMaxGranularity.
#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/symmetric/pair_handles.h"
#include "allocator/symmetric/symmetric_heap.h"

namespace cma {
namespace {

// The largest VMM granularity a member may announce (CUDA's is 2 MiB; a
// recommended granularity can be larger, never near this).
constexpr std::uint64_t kMaxGranularity = std::uint64_t{1} << 30;

bool PowerOfTwo(std::uint64_t g) { return g != 0 && (g & (g - 1)) == 0; }

}  // namespace

absl::StatusOr<std::size_t> SymmetricHeap::StrideFor(std::size_t bytes,
                                                     std::size_t granularity) const {
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  if (!PowerOfTwo(granularity)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: granularity %d is not a power of two", granularity));
  }
  const auto too_large = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: a request of %d bytes is too large: its stride (the size rounded to 256 "
        "bytes, plus %d signal bytes, rounded to the %d-byte granularity), times %d members, "
        "overflows the address space",
        bytes, options_.signal_bytes, granularity, group_.world_size));
  };
  if (bytes > kMax - 255) return too_large();
  std::size_t stride = (bytes + 255) / 256 * 256;
  if (stride > kMax - options_.signal_bytes) return too_large();
  stride += options_.signal_bytes;
  if (stride > kMax - (granularity - 1)) return too_large();
  stride = (stride + granularity - 1) / granularity * granularity;
  // One reservation holds every member's stride.
  if (stride > kMax / static_cast<std::size_t>(std::max(group_.world_size, 1))) {
    return too_large();
  }
  return stride;
}

absl::StatusOr<SymmetricHeap::Agreed> SymmetricHeap::AgreeOnSize(std::size_t bytes,
                                                                 bool make_symmetric) {
  // This member's own verdict on its request, before anything is agreed.
  absl::Status local;
  if (bytes == 0) {
    local = absl::InvalidArgumentError("symmetric heap: cannot allocate 0 bytes");
  } else {
    local = StrideFor(bytes, granularity_).status();
  }
  if (exchange_->process_count() == 1) {
    // Every member is in this process and shares this cache: there is no
    // one to agree with, and a hit stays a few map operations.
    if (!local.ok()) return local;
    Agreed out;
    out.bytes = bytes;
    out.stride = *StrideFor(bytes, granularity_);
    group_granularity_ = granularity_;
    out.candidates = {Candidate(out.stride)};
    return out;
  }
  // Without make_symmetric every member's stride is the agreed one (sizes
  // must match), so each names its candidate for it in the same round.
  // Before the first exchange the group's granularity is unknown, and the
  // cache is empty.
  std::uint64_t candidate = 0;
  if (!make_symmetric && group_granularity_ != 0 && local.ok()) {
    absl::StatusOr<std::size_t> stride = StrideFor(bytes, group_granularity_);
    if (stride.ok()) candidate = Candidate(*stride);
  }
  Contribution mine;
  symmetric_internal::Put(mine.bytes, static_cast<std::uint64_t>(bytes));
  symmetric_internal::Put(mine.bytes, static_cast<std::uint64_t>(granularity_));
  symmetric_internal::Put(mine.bytes, static_cast<std::uint8_t>(make_symmetric));
  symmetric_internal::Put(mine.bytes, candidate);
  // A bad request still joins the round, so that the others fail with it
  // now rather than wait out their timeout.
  absl::StatusOr<std::vector<Contribution>> all = Round(Op::kSize, local, mine);
  if (!all.ok()) return all.status();
  std::uint64_t largest = 0, granularity = 0;
  std::size_t largest_from = 0;
  std::vector<std::uint64_t> sizes;
  Agreed out;
  for (std::size_t p = 0; p < all->size(); ++p) {
    std::size_t pos = 0;
    std::uint64_t b = 0, g = 0, c = 0;
    std::uint8_t sym = 0;
    const std::string& in = (*all)[p].bytes;
    if (!symmetric_internal::Get(in, pos, b) || !symmetric_internal::Get(in, pos, g) ||
        !symmetric_internal::Get(in, pos, sym) || !symmetric_internal::Get(in, pos, c)) {
      return absl::DataLossError(absl::StrCat("symmetric heap: malformed size from process ", p));
    }
    if (static_cast<bool>(sym) != make_symmetric) {
      return absl::InvalidArgumentError(
          "symmetric heap: processes disagree on make_symmetric for one collective allocation");
    }
    // A granularity is a power of two, and the group's (the largest) is a
    // multiple of every member's, this one's included.
    if (!PowerOfTwo(g) || g > kMaxGranularity) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "symmetric heap: process %d announces a VMM granularity of %d bytes (a power of two up "
          "to %d is expected)",
          p, g, kMaxGranularity));
    }
    sizes.push_back(b);
    out.candidates.push_back(c);
    if (b > largest) largest_from = p;
    largest = std::max(largest, b);
    granularity = std::max(granularity, g);
  }
  if (!make_symmetric && std::any_of(sizes.begin(), sizes.end(),
                                     [&](std::uint64_t s) { return s != sizes[0]; })) {
    std::string list;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      absl::StrAppend(&list, p ? ", " : "", "process ", p, ": ", sizes[p]);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "symmetric heap: members asked for different sizes (", list,
        "); pass make_symmetric to round every member up to the largest"));
  }
  // The group's stride, as this member derives it from every request: every
  // member computes the same from the same bytes, so all refuse together.
  absl::StatusOr<std::size_t> stride =
      largest > std::numeric_limits<std::size_t>::max()
          ? absl::StatusOr<std::size_t>(absl::InvalidArgumentError("larger than size_t"))
          : StrideFor(static_cast<std::size_t>(largest), static_cast<std::size_t>(granularity));
  if (!stride.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: the group's size (process %d's request of %d bytes, at the group's "
        "%d-byte granularity) cannot be served: %s",
        largest_from, largest, granularity, stride.status().message()));
  }
  if (*stride % granularity_ != 0) {
    return absl::InternalError(absl::StrFormat(
        "symmetric heap: the group's stride %d is not a multiple of this process's granularity %d",
        *stride, granularity_));
  }
  group_granularity_ = static_cast<std::size_t>(granularity);
  out.bytes = static_cast<std::size_t>(largest);
  out.stride = *stride;
  if (make_symmetric) {
    // The agreed stride is known only now: a second round names the
    // candidates for it.
    Contribution second;
    symmetric_internal::Put(second.bytes, Candidate(out.stride));
    absl::StatusOr<std::vector<Contribution>> named =
        Round(Op::kCandidates, absl::OkStatus(), second);
    if (!named.ok()) return named.status();
    out.candidates.clear();
    for (std::size_t p = 0; p < named->size(); ++p) {
      std::size_t pos = 0;
      std::uint64_t c = 0;
      if (!symmetric_internal::Get((*named)[p].bytes, pos, c)) {
        return absl::DataLossError(
            absl::StrCat("symmetric heap: malformed cache candidate from process ", p));
      }
      out.candidates.push_back(c);
    }
  }
  return out;
}

absl::Status SymmetricHeap::AgreeOnCreate(const absl::Status& local) {
  group_non_dumpable_ = options_.non_dumpable;
  if (exchange_->process_count() == 1) return local;
  Contribution mine;
  symmetric_internal::Put(mine.bytes, static_cast<std::int32_t>(group_.world_size));
  symmetric_internal::Put(mine.bytes, static_cast<std::uint8_t>(options_.provider));
  symmetric_internal::Put(mine.bytes, static_cast<std::uint64_t>(options_.signal_bytes));
  symmetric_internal::Put(mine.bytes, static_cast<std::uint8_t>(options_.non_dumpable));
  absl::StatusOr<std::vector<Contribution>> all = Round(Op::kCreate, local, mine);
  if (!all.ok()) return all.status();
  std::vector<std::string> differ;
  bool non_dumpable = false;
  for (std::size_t p = 0; p < all->size(); ++p) {
    std::size_t pos = 0;
    std::int32_t world = 0;
    std::uint8_t provider = 0, nd = 0;
    std::uint64_t signal = 0;
    const std::string& in = (*all)[p].bytes;
    if (!symmetric_internal::Get(in, pos, world) || !symmetric_internal::Get(in, pos, provider) ||
        !symmetric_internal::Get(in, pos, signal) || !symmetric_internal::Get(in, pos, nd) ||
        nd > 1) {
      return absl::DataLossError(
          absl::StrCat("symmetric heap: malformed create round from process ", p));
    }
    if (world != group_.world_size || provider != static_cast<std::uint8_t>(options_.provider) ||
        signal != options_.signal_bytes) {
      differ.push_back(absl::StrFormat(
          "process %d: world size %d, provider %s, signal_bytes %d", p, world,
          provider <= 1 ? SymmetricProviderName(static_cast<SymmetricProvider>(provider)) : "?",
          signal));
    }
    non_dumpable = non_dumpable || nd != 0;
  }
  if (!differ.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: the processes were created with different shapes or options (this "
        "process: world size %d, provider %s, signal_bytes %d; %s): every process must pass the "
        "same",
        group_.world_size, SymmetricProviderName(options_.provider), options_.signal_bytes,
        absl::StrJoin(differ, "; ")));
  }
  // The strictest: one member's non_dumpable protects its memory only if
  // every member that maps it is non-dumpable too.
  group_non_dumpable_ = non_dumpable;
  return absl::OkStatus();
}

absl::Status SymmetricHeap::CheckSameShape(const std::vector<Contribution>& all,
                                           std::size_t bytes, std::size_t stride) const {
  for (std::size_t p = 0; p < all.size(); ++p) {
    std::size_t pos = 0;
    std::uint64_t b = 0, s = 0;
    if (!symmetric_internal::Get(all[p].bytes, pos, b) ||
        !symmetric_internal::Get(all[p].bytes, pos, s)) {
      return absl::DataLossError(
          absl::StrCat("symmetric heap: malformed size and stride from process ", p));
    }
    if (b != bytes || s != stride) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "symmetric heap: process %d built %d bytes at a stride of %d, this process %d at %d: "
          "the members do not agree on the allocation's shape, so none keeps it",
          p, b, s, bytes, stride));
    }
  }
  return absl::OkStatus();
}

std::string SymmetricHeap::ShapeBytes(std::size_t bytes, std::size_t stride) {
  std::string out;
  symmetric_internal::Put(out, static_cast<std::uint64_t>(bytes));
  symmetric_internal::Put(out, static_cast<std::uint64_t>(stride));
  return out;
}

}  // namespace cma
