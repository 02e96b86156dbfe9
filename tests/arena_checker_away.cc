// ArenaChecker's away steps (allocator/away.cc): SendAway and BringBack of a
// random live allocation on a random stream. The checks after each step
// (arena_checker.cc) see them as any placement: the prefetches' ordering,
// the tags, and reserved_bytes against the pages the backend holds on the
// device (an away allocation's inner pages wait on the host, uncounted).
#include "absl/strings/str_format.h"
#include "tests/arena_checker.h"

namespace cma {

absl::Status ArenaChecker::DoAway(StepSource& in) {
  const bool away = in.Next(2) == 0;
  std::uintptr_t p = PickLive(in);
  if (!away) {
    // Mostly one that is away: bringing back what is not is a no-op.
    std::vector<std::uintptr_t> gone;
    for (const auto& [q, l] : live_) {
      if (IsAway(q)) gone.push_back(q);
    }
    if (!gone.empty() && in.Next(4) != 0) p = gone[in.Next(static_cast<std::uint32_t>(gone.size()))];
  }
  if (p == 0) return absl::OkStatus();
  Live& l = live_.at(p);
  const Stream st = PickStream(in);
  void* ptr = reinterpret_cast<void*>(p);
  const DeviceStats before = *alloc_->GetStats(0);
  const char* what = away ? "send_away" : "bring_back";
  absl::Status s = away ? alloc_->SendAway({&ptr, 1}, st) : alloc_->BringBack({&ptr, 1}, st);
  if (Quiet()) return ExpectRefused(s, what);
  Note(absl::StrFormat("%s %#x on %d", what, p, st));
  if (absl::Status c = CheckCalls(); !c.ok()) return c;
  if (!s.ok()) {
    // Refusals the state explains: a private pool's block, one a Sleep
    // left, a classic segment, no room to bring it back.
    const bool explained =
        (s.code() == absl::StatusCode::kFailedPrecondition &&
         (l.pool != 0 || l.staged || asleep_ || !check_placement_ ||
          alloc_->config().segments != SegmentMode::kArena)) ||
        (!away && s.code() == absl::StatusCode::kResourceExhausted);
    if (!explained) return Violation(absl::StrCat(what, " failed: ", s.ToString()));
    return absl::OkStatus();
  }
  if (l.pool != 0) return Violation(absl::StrFormat("%s of pool block %#x succeeded", what, p));
  // A transfer (not a no-op) is a use of the block by `st`: its free
  // waits for it.
  const DeviceStats after = *alloc_->GetStats(0);
  const bool moved = after.sent_away_bytes != before.sent_away_bytes ||
                     after.brought_back_bytes != before.brought_back_bytes;
  if (moved && st != l.stream && std::find(l.uses.begin(), l.uses.end(), st) == l.uses.end()) {
    l.uses.push_back(st);
  }
  if (!asleep_) l.away = away;
  if (!l.dead && !l.staged && !TagIntact(p, l)) {
    return Violation(absl::StrFormat("the contents of %#x (+%d) changed in %s", p, l.size, what));
  }
  return absl::OkStatus();
}

bool ArenaChecker::IsAway(std::uintptr_t p) const {
  for (const SegmentSnapshot& seg : alloc_->Snapshot()) {
    for (const BlockSnapshot& b : seg.blocks) {
      if (b.address == p) return b.away;
    }
  }
  return false;
}

absl::StatusOr<std::size_t> ArenaChecker::AwayPagesHeld() const {
  std::size_t held = 0;
  for (const SegmentSnapshot& seg : alloc_->Snapshot()) {
    for (const BlockSnapshot& b : seg.blocks) {
      if (!b.away) continue;
      const std::uintptr_t first = b.address / kPageSize * kPageSize;
      const std::uintptr_t last = (b.address + b.size - 1) / kPageSize * kPageSize;
      for (std::uintptr_t page = first + kPageSize; page < last; page += kPageSize) {
        const int where = backend_->PageLocation(reinterpret_cast<void*>(page));
        // Nothing here touches an away allocation's pages on the device: a
        // populated one is on the host, where SendAway put it.
        if (where != kPageUnpopulated && where != kPageOnHost) {
          return Violation(absl::StrFormat("page %#x of away allocation %#x (+%d) is at %d",
                                           page, b.address, b.size, where));
        }
        held += where == kPageOnHost ? kPageSize : 0;
      }
    }
  }
  return held;
}

}  // namespace cma
