#include "tests/arena_checker.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "policy/size_policy.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kLogLines = 40;

std::uintptr_t PageDown(std::uintptr_t a) { return a / kPageSize * kPageSize; }
std::uintptr_t PageUp(std::uintptr_t a) { return (a + kPageSize - 1) / kPageSize * kPageSize; }
bool Overlaps(std::uintptr_t lo1, std::uintptr_t hi1, std::uintptr_t lo2, std::uintptr_t hi2) {
  return lo1 < hi2 && lo2 < hi1;
}

}  // namespace

std::uint32_t ByteSource::Next(std::uint32_t bound) {
  std::uint32_t v = 0;
  // As many bytes as the bound needs, so the fuzzer's mutations stay local.
  for (std::uint32_t b = bound - 1; b != 0; b >>= 8) {
    v = v << 8 | (n_ != 0 ? (--n_, *p_++) : 0);
  }
  return v % bound;
}

absl::StatusOr<std::unique_ptr<ArenaChecker>> ArenaChecker::Create(absl::string_view config,
                                                                   std::size_t capacity,
                                                                   bool pool_checkpoints,
                                                                   bool away_steps,
                                                                   int busy_query_percent) {
  std::unique_ptr<ArenaChecker> c(new ArenaChecker);
  c->pool_checkpoints_ = pool_checkpoints;
  c->away_steps_ = away_steps;
  c->capacity_ = capacity;
  // Pinned memory for a quarter of the device: big sleeps also take the
  // path where staging runs out and the rest migrates.
  c->backend_ = std::make_unique<HostBackend>(
      HostBackendOptions{.device_count = 1,
                         .device_capacity = capacity,
                         .manual_completion = true,
                         .pinned_capacity = capacity / 4,
                         .busy_query_percent = busy_query_percent});
  auto a = CachingManagedAllocator::Create(*c->backend_, config);
  if (!a.ok()) return a.status();
  c->alloc_ = std::move(*a);
  const AllocatorConfig& cfg = c->alloc_->config();
  c->check_placement_ =
      cfg.segments == SegmentMode::kArena && cfg.prefetch == PrefetchPolicy::kOnAlloc;
  for (int i = 0; i < kStreams; ++i) {
    absl::StatusOr<Stream> s = c->backend_->CreateStream(0);
    if (!s.ok()) return s.status();
    c->streams_.push_back(*s);
  }
  c->backend_->ClearRecords();
  return c;
}

ArenaChecker::~ArenaChecker() {
  alloc_.reset();
  if (backend_ == nullptr) return;
  for (Stream s : streams_) backend_->DestroyStream(s).IgnoreError();
}

absl::Status ArenaChecker::Violation(absl::string_view what) const {
  return absl::FailedPreconditionError(
      absl::StrCat("step ", steps_, ": ", what, "\nrecent steps:\n", log()));
}

void ArenaChecker::Note(std::string line) {
  log_.push_back(absl::StrCat(steps_, ": ", line));
  if (log_.size() > kLogLines) log_.pop_front();
}

std::string ArenaChecker::log() const { return absl::StrJoin(log_, "\n"); }

Stream ArenaChecker::PickStream(StepSource& in) const {
  const std::uint32_t i = in.Next(kStreams * 4 + 1);
  return i == kStreams * 4 ? kDefaultStream : streams_[i % kStreams];
}

std::uintptr_t ArenaChecker::PickLive(StepSource& in) const {
  if (live_.empty()) return 0;
  auto it = live_.begin();
  std::advance(it, in.Next(static_cast<std::uint32_t>(live_.size())));
  return it->first;
}

std::int64_t ArenaChecker::Submitted(Stream s) { return backend_->StreamPosition(s).first; }

bool ArenaChecker::Completed(Stream on, std::int64_t ticket) {
  return backend_->StreamPosition(on).second >= ticket;
}

bool ArenaChecker::Ordered(Stream s, Stream on, std::int64_t ticket) {
  if (s == on || Completed(on, ticket)) return true;
  auto it = waited_.find({s, on});
  return it != waited_.end() && it->second >= ticket;
}

// ---------------------------------------------------------------- tags

void ArenaChecker::WriteTag(std::uintptr_t p, const Live& l) {
  for (std::size_t off : {std::size_t{0}, l.size / 2, l.size - 1}) {
    *reinterpret_cast<std::uint8_t*>(p + off) = static_cast<std::uint8_t>(1 + (l.tag + off) % 255);
  }
}

bool ArenaChecker::TagIntact(std::uintptr_t p, const Live& l) const {
  for (std::size_t off : {std::size_t{0}, l.size / 2, l.size - 1}) {
    if (*reinterpret_cast<const std::uint8_t*>(p + off) != 1 + (l.tag + off) % 255) return false;
  }
  return true;
}

// ---------------------------------------------------------------- backend calls

absl::Status ArenaChecker::CheckDiscard(std::uintptr_t lo, std::uintptr_t hi, Stream x,
                                        std::int64_t ticket, bool then_populate) {
  // The host backend (like the driver's accounting) discards whole pages only.
  const std::uintptr_t plo = PageUp(lo), phi = PageDown(hi);
  if (plo >= phi) return absl::OkStatus();
  for (auto& [p, l] : live_) {
    if (!Overlaps(plo, phi, p, p + l.size)) continue;
    // Discarded at this sleep level, by the Sleep only: a Wake may drop
    // only what the matching Sleep dropped (`gone` below).
    const bool level_drops = discarding_ == Discarding::kSleep &&
                             (l.disposable || (sleep_level_ == SleepLevel::kDiscard && !l.keep));
    // Whole pages whose contents a Sleep has copied out first, or that hold
    // nothing until the copy back (their population by Wake or Move).
    const bool staged = (discarding_ == Discarding::kSleep && l.copied) || l.staged;
    // Contents already thrown away (an earlier level-2 or disposable drop).
    const bool gone = discarding_ != Discarding::kNone && l.dead;
    const bool allowed = level_drops || staged || gone || p == dead_move_;
    if (!allowed) {
      return Violation(absl::StrFormat("discard [%#x, %#x) on stream %d hits live allocation "
                                       "%#x (+%d)", plo, phi, x, p, l.size));
    }
    if (discarding_ == Discarding::kSleep) {
      std::vector<Stream> users = l.uses;
      users.push_back(l.stream);
      for (Stream u : users) {
        // The work queued on u when Sleep was called.
        auto before = submitted_at_sleep_.find(u);
        if (!Ordered(x, u, before == submitted_at_sleep_.end() ? 0 : before->second)) {
          return Violation(absl::StrFormat("sleep discards %#x on stream %d before the work "
                                           "queued on its user stream %d", p, x, u));
        }
      }
    }
    if (level_drops || p == dead_move_) {
      l.dead = true;
    } else if (staged) {
      l.staged = true;
    }
  }
  for (const Use& u : retired_) {
    if (u.stream != x && Overlaps(plo, phi, u.lo, u.hi) && !Ordered(x, u.stream, u.ticket)) {
      return Violation(absl::StrFormat("discard [%#x, %#x) on stream %d may run before stream "
                                       "%d's last use of [%#x, %#x)", plo, phi, x, u.stream,
                                       u.lo, u.hi));
    }
  }
  if (!then_populate && !Completed(x, ticket)) discards_.push_back({plo, phi, x, ticket});
  return absl::OkStatus();
}

absl::Status ArenaChecker::CheckPopulation(std::uintptr_t lo, std::uintptr_t hi, Stream s) {
  const std::uintptr_t plo = PageDown(lo), phi = PageUp(hi);
  for (const PendingDiscard& d : discards_) {
    if (d.stream != s && Overlaps(plo, phi, d.lo, d.hi) && !Ordered(s, d.stream, d.ticket)) {
      return Violation(absl::StrFormat("stream %d populates [%#x, %#x) before stream %d's "
                                       "queued discard of [%#x, %#x) has run or been waited for",
                                       s, lo, hi, d.stream, d.lo, d.hi));
    }
  }
  return absl::OkStatus();
}

void ArenaChecker::AddWait(const StreamWaitRecord& w) {
  // Ordering is transitive: what `on` waited for before the event was
  // recorded, the waiter now waits for too.
  std::vector<std::pair<Stream, std::int64_t>> inherited;
  for (const auto& [key, ticket] : waited_) {
    if (key.first == w.on && key.second != w.stream) inherited.push_back({key.second, ticket});
  }
  inherited.push_back({w.on, w.ticket});
  for (const auto& [on, ticket] : inherited) {
    std::int64_t& t = waited_[{w.stream, on}];
    t = std::max(t, ticket);
  }
}

absl::Status ArenaChecker::CheckCalls() {
  std::vector<PlacementRecord> records = backend_->Records();
  std::vector<StreamWaitRecord> waits = backend_->Waits();
  backend_->ClearRecords();
  std::size_t w = 0;
  for (const PlacementRecord& r : records) {
    for (; w < waits.size() && waits[w].seq < r.seq; ++w) AddWait(waits[w]);
    const auto lo = reinterpret_cast<std::uintptr_t>(r.ptr);
    const std::uintptr_t hi = lo + r.bytes;
    if (std::getenv("CMA_CHECKER_TRACE") != nullptr) {
      fprintf(stderr, "  call op %d [%#lx, %#lx) on %lu to %s\n", static_cast<int>(r.op), lo, hi,
              static_cast<unsigned long>(r.stream), LocationName(r.location).c_str());
    }
    absl::Status s;
    switch (r.op) {
      case PlacementRecord::Op::kAdvise: break;
      case PlacementRecord::Op::kDiscard: s = CheckDiscard(lo, hi, r.stream, r.ticket, false); break;
      case PlacementRecord::Op::kDiscardAndPrefetch:
        s = CheckDiscard(lo, hi, r.stream, r.ticket, true);
        if (s.ok() && !r.location.is_host()) s = CheckPopulation(lo, hi, r.stream);
        break;
      case PlacementRecord::Op::kPrefetch:
        if (!r.location.is_host()) s = CheckPopulation(lo, hi, r.stream);
        break;
      case PlacementRecord::Op::kCopy: s = CheckCopy(r); break;
    }
    if (!s.ok()) return s;
  }
  for (; w < waits.size(); ++w) AddWait(waits[w]);
  for (auto& [p, l] : live_) {
    if (!l.restored) continue;
    l.restored = l.staged = l.copied = false;
  }
  return absl::OkStatus();
}

absl::Status ArenaChecker::CheckCopy(const PlacementRecord& r) {
  const auto src = reinterpret_cast<std::uintptr_t>(r.src);
  const auto dst = reinterpret_cast<std::uintptr_t>(r.ptr);
  for (auto& [p, l] : live_) {
    if (Overlaps(src, src + r.bytes, p, p + l.size)) {
      // Only a Sleep copies out of an allocation (exact bytes; adjacent
      // allocations in one copy).
      if (discarding_ != Discarding::kSleep) {
        return Violation(absl::StrFormat("copy out of [%#x, +%d) on stream %d outside a sleep "
                                         "or beyond allocation %#x (+%d)", src, r.bytes,
                                         r.stream, p, l.size));
      }
      std::vector<Stream> users = l.uses;
      users.push_back(l.stream);
      for (Stream u : users) {
        auto before = submitted_at_sleep_.find(u);
        if (!Ordered(r.stream, u, before == submitted_at_sleep_.end() ? 0 : before->second)) {
          return Violation(absl::StrFormat("sleep copies %#x out on stream %d before the work "
                                           "queued on its user stream %d", p, r.stream, u));
        }
      }
      l.copied = true;
    }
    if (Overlaps(dst, dst + r.bytes, p, p + l.size)) {
      // Only staged contents are copied back: every allocation a copy
      // writes was staged (a copy may span adjacent ones, or a piece of
      // one where the staging's chunks split it).
      if (!l.staged) {
        return Violation(absl::StrFormat("copy into [%#x, +%d) on stream %d overwrites live "
                                         "allocation %#x (+%d), which was not staged", dst,
                                         r.bytes, r.stream, p, l.size));
      }
      l.restored = true;  // no longer staged once this batch of calls is checked
    }
  }
  if (absl::Status s = CheckPopulation(dst, dst + r.bytes, r.stream); !s.ok()) return s;
  return absl::OkStatus();
}

absl::Status ArenaChecker::CheckTags() const {
  for (const auto& [p, l] : live_) {
    if (!l.dead && !l.staged && !TagIntact(p, l)) {
      return Violation(absl::StrFormat("the contents of live %#x (+%d) changed", p, l.size));
    }
  }
  return absl::OkStatus();
}

void ArenaChecker::Prune() {
  retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                [&](const Use& u) { return Completed(u.stream, u.ticket); }),
                 retired_.end());
  discards_.erase(std::remove_if(discards_.begin(), discards_.end(),
                                 [&](const PendingDiscard& d) {
                                   return Completed(d.stream, d.ticket);
                                 }),
                  discards_.end());
}

absl::Status ArenaChecker::CheckResident(std::uintptr_t p, std::size_t size) const {
  if (!check_placement_) return absl::OkStatus();
  for (std::uintptr_t page = PageUp(p); page + kPageSize <= p + size; page += kPageSize) {
    // A private pool's own segment (AllocateManaged, not an arena): the
    // backend does not track its pages.
    if (!backend_->InReservedRange(reinterpret_cast<void*>(page))) continue;
    const int where = backend_->PageLocation(reinterpret_cast<void*>(page));
    if (where != 0) {
      return Violation(absl::StrFormat("page %#x of allocation %#x (+%d) is at %d, not on "
                                       "device 0", page, p, size, where));
    }
  }
  return absl::OkStatus();
}

absl::Status ArenaChecker::CheckResident() const {
  for (const auto& [p, l] : live_) {
    if (absl::Status s = CheckResident(p, l.size); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- steps

absl::Status ArenaChecker::DoAlloc(StepSource& in) {
  std::size_t size;
  switch (in.Next(5)) {
    case 0:
    case 1: size = 1 + in.Next(64 * 1024); break;
    case 2: size = 1 + in.Next(static_cast<std::uint32_t>(kMiB)); break;
    case 3: size = kMiB + in.Next(static_cast<std::uint32_t>(8 * kMiB)); break;
    default: size = 8 * kMiB + in.Next(static_cast<std::uint32_t>(capacity_ / 4)); break;
  }
  const Stream s = PickStream(in);
  const std::uint32_t pool = Route(s);
  absl::StatusOr<void*> got = alloc_->Allocate(size, 0, s);
  Note(absl::StrFormat("alloc %d on %d -> %s", size, s,
                       got.ok() ? absl::StrFormat("%p", *got) : got.status().ToString()));
  if (absl::Status c = CheckCalls(); !c.ok()) return c;
  if (!got.ok()) {
    if (absl::IsResourceExhausted(got.status())) return absl::OkStatus();
    return Violation(absl::StrCat("allocate failed: ", got.status().ToString()));
  }
  const auto p = reinterpret_cast<std::uintptr_t>(*got);
  const std::uintptr_t end = p + size;
  for (auto& [q, l] : live_) {
    if (Overlaps(p, end, q, q + l.size)) {
      return Violation(absl::StrFormat("%#x (+%d) handed out over live %#x (+%d)", p, size, q,
                                       l.size));
    }
  }
  for (const Use& u : retired_) {
    if (u.stream != s && Overlaps(p, end, u.lo, u.hi) && !Ordered(s, u.stream, u.ticket)) {
      return Violation(absl::StrFormat("%#x (+%d) handed out to stream %d while stream %d may "
                                       "still use [%#x, %#x)", p, size, s, u.stream, u.lo, u.hi));
    }
  }
  if (absl::Status c = CheckPopulation(p, end, s); !c.ok()) return c;
  for (auto& [other, ranges] : pool_free_) {
    for (auto r = ranges.begin(); r != ranges.end();) {
      if (!Overlaps(p, end, r->first, r->second)) {
        ++r;
        continue;
      }
      if (other != pool) {
        return Violation(absl::StrFormat("%#x (+%d) for pool %d overlaps [%#x, %#x), freed into "
                                         "pool %d", p, size, pool, r->first, r->second, other));
      }
      // Its own pool's free space: what is left of the range stays the pool's.
      const auto [lo, hi] = *r;
      r = ranges.erase(r);
      if (lo < p) r = ranges.insert(r, {lo, p}) + 1;
      if (end < hi) r = ranges.insert(r, {end, hi}) + 1;
    }
  }
  // While a pool is allocated to, nothing is prefetched: first touch places.
  if (!Quiet()) {
    if (absl::Status r = CheckResident(p, size); !r.ok()) return r;
  }
  // The user's kernel touches the memory, populating what was not
  // prefetched. It touches the whole rounded block: the allocator counts
  // the pages of its blocks in use as populated, and a kernel that touched
  // only the requested bytes would leave a rounding tail counted but empty
  // (conservative: reserved may exceed the device's use by that tail).
  backend_->Touch(reinterpret_cast<void*>(p), RoundRequest(size, alloc_->config()), 0);
  Live l{size, s, {}, next_tag_++};
  l.pool = pool;
  WriteTag(p, l);
  live_.emplace(p, std::move(l));
  return absl::OkStatus();
}

absl::Status ArenaChecker::DoFree(std::uintptr_t p) {
  auto it = live_.find(p);
  const Live l = it->second;
  Note(absl::StrFormat("free %#x (+%d, stream %d)", p, l.size, l.stream));
  // A staged allocation freed while asleep: its contents were in the
  // staging, which the free forgets.
  if (!l.dead && !l.staged && !TagIntact(p, l)) {
    return Violation(absl::StrFormat("the contents of live %#x (+%d) changed", p, l.size));
  }
  live_.erase(it);
  if (l.pool != 0) pool_free_[l.pool].push_back({p, p + l.size});
  std::vector<Stream> users = l.uses;
  users.push_back(l.stream);
  for (Stream u : users) retired_.push_back({p, p + l.size, u, Submitted(u)});
  if (absl::Status s = alloc_->Free(reinterpret_cast<void*>(p)); !s.ok()) {
    return Violation(absl::StrCat("free failed: ", s.ToString()));
  }
  ForgetDissolvedPools();
  return CheckCalls();
}

absl::Status ArenaChecker::DoMove(StepSource& in) {
  const std::uintptr_t p = PickLive(in);
  if (p == 0) return absl::OkStatus();
  Live& l = live_.at(p);
  const Location target = in.Next(2) == 0 ? Location::Host() : Location::Device(0);
  const bool dead = in.Next(4) == 0;
  if (Quiet()) {
    return ExpectRefused(alloc_->Move(reinterpret_cast<void*>(p), target, l.stream, dead), "move");
  }
  Note(absl::StrFormat("move %#x to %s%s", p, LocationName(target), dead ? " (dead)" : ""));
  dead_move_ = dead ? p : 0;
  absl::Status s = alloc_->Move(reinterpret_cast<void*>(p), target, l.stream, dead);
  absl::Status c = CheckCalls();
  dead_move_ = 0;
  // An allocation sent away comes back to its device only with the room
  // BringBack needs (the budget may have shrunk since): refused, unmoved.
  if (s.code() == absl::StatusCode::kResourceExhausted && !target.is_host() && IsAway(p)) {
    return c;
  }
  if (!s.ok()) return Violation(absl::StrCat("move failed: ", s.ToString()));
  if (!c.ok()) return c;
  // The user overwrites what it declared dead, or what a Sleep dropped and
  // the move populated again: live data that no Wake may drop.
  if (dead || l.dead) {
    l.dead = false;
    l.staged = l.copied = false;
    WriteTag(p, l);
  }
  // A staged allocation's contents come back with the move, bit for bit.
  if (l.staged) return Violation(absl::StrFormat("move left %#x's contents in the staging", p));
  if (!l.dead && !TagIntact(p, l)) {
    return Violation(absl::StrFormat("the contents of %#x (+%d) changed in a move", p, l.size));
  }
  l.away = target.is_host();
  return absl::OkStatus();
}

absl::Status ArenaChecker::DoSleep(Stream s, SleepLevel level) {
  Note(absl::StrFormat("sleep level %d on %d", static_cast<int>(level), s));
  sleep_level_ = level;
  submitted_at_sleep_.clear();
  submitted_at_sleep_[kDefaultStream] = Submitted(kDefaultStream);
  for (Stream u : streams_) submitted_at_sleep_[u] = Submitted(u);
  discarding_ = Discarding::kSleep;
  absl::StatusOr<std::size_t> slept = alloc_->Sleep(0, s, level);
  absl::Status c = CheckCalls();
  discarding_ = Discarding::kNone;
  if (!slept.ok()) return Violation(absl::StrCat("sleep failed: ", slept.status().ToString()));
  if (!c.ok()) return c;
  asleep_ = true;
  for (auto& [p, l] : live_) {
    l.away = true;
    // Copied out but not discarded (a partial page only): still in place.
    if (!l.staged) l.copied = false;
  }
  // What was not discarded is still there (migrated to the host).
  return CheckTags();
}

absl::Status ArenaChecker::DoReleaseStaging() {
  Note("release sleep staging");
  absl::StatusOr<std::size_t> r = alloc_->ReleaseSleepStaging(0);
  if (Quiet()) return ExpectRefused(r.status(), "release_sleep_staging");
  bool holds = false;
  for (const auto& [p, l] : live_) holds = holds || l.staged;
  if (holds) {
    // Refused, changing nothing: the staged contents stay restorable.
    if (r.status().code() != absl::StatusCode::kFailedPrecondition) {
      return Violation(absl::StrCat("release_sleep_staging while it holds contents: ",
                                    r.status().ToString()));
    }
    return absl::OkStatus();
  }
  if (!r.ok()) return Violation(absl::StrCat("release_sleep_staging: ", r.status().ToString()));
  if (alloc_->GetStats(0)->host_staging_bytes[kAllPools].current != 0 ||
      backend_->LiveResources().pinned_bytes != 0) {
    return Violation("release_sleep_staging left pinned memory");
  }
  return absl::OkStatus();
}

absl::Status ArenaChecker::DoForget(StepSource& in) {
  const int i = static_cast<int>(in.Next(kStreams));
  const Stream s = streams_[i];
  Note(absl::StrFormat("forget and destroy stream %d", s));
  if (absl::Status f = alloc_->ForgetStream(s); !f.ok()) {
    return Violation(absl::StrCat("forget failed: ", f.ToString()));
  }
  if (absl::Status c = CheckCalls(); !c.ok()) return c;
  for (auto& [p, l] : live_) {
    if (l.stream == s) l.stream = kDefaultStream;
    l.uses.erase(std::remove(l.uses.begin(), l.uses.end(), s), l.uses.end());
  }
  Prune();
  // Work may stay queued only on a stream the allocator never used: nothing
  // it did can still touch memory then.
  for (const Use& u : retired_) {
    if (u.stream == s) return Violation("forgot a stream whose last use may still run");
  }
  for (const PendingDiscard& d : discards_) {
    if (d.stream == s) return Violation("forgot a stream whose discard may still run");
  }
  for (auto it = waited_.begin(); it != waited_.end();) {
    auto here = it++;
    if (here->first.first == s || here->first.second == s) waited_.erase(here);
  }
  if (!backend_->DestroyStream(s).ok()) return Violation("stream destroy failed");
  absl::StatusOr<Stream> fresh = backend_->CreateStream(0);
  if (!fresh.ok()) return fresh.status();
  streams_[i] = *fresh;
  return absl::OkStatus();
}

absl::Status ArenaChecker::Step(StepSource& in) {
  ++steps_;
  absl::Status s;
  if (away_steps_ && in.Next(10) == 0) {
    s = DoAway(in);
    if (!s.ok()) {
      return s.code() == absl::StatusCode::kFailedPrecondition ? s : Violation(s.ToString());
    }
    return AfterStep();
  }
  const std::uint32_t op = in.Next(100);
  if (op < 34) {
    s = DoAlloc(in);
  } else if (op < 58) {
    if (std::uintptr_t p = PickLive(in); p != 0) s = DoFree(p);
  } else if (op < 66) {
    const Stream st = streams_[in.Next(kStreams)];
    Note(absl::StrFormat("work on %d", st));
    s = backend_->EnqueueWork(st);
  } else if (op < 75) {
    const Stream st = streams_[in.Next(kStreams)];
    Note(absl::StrFormat("complete %d", st));
    s = backend_->CompleteWork(st);
  } else if (op < 79) {
    const std::uintptr_t p = PickLive(in);
    const Stream st = PickStream(in);
    if (p != 0) {
      Note(absl::StrFormat("record_stream %#x on %d", p, st));
      s = alloc_->RecordStream(reinterpret_cast<void*>(p), st);
      Live& l = live_.at(p);
      if (s.ok() && st != l.stream &&
          std::find(l.uses.begin(), l.uses.end(), st) == l.uses.end()) {
        l.uses.push_back(st);
      }
    }
  } else if (op < 81 || (pool_checkpoints_ && op >= 98)) {
    // Two in a hundred (four with checkpoints): begin, end or release a pool.
    s = DoPoolStep(in);
  } else if (op < 83) {
    Note("empty_cache");
    s = alloc_->EmptyCache();
    if (Quiet()) s = ExpectRefused(s, "empty_cache");
    if (s.ok() && in.Next(2) == 0) s = DoReleaseStaging();
  } else if (op < 87) {
    static constexpr double kFractions[] = {1.0 / 64, 1.0 / 8, 0.25, 0.5, 0.75, 1.0};
    const double f = kFractions[in.Next(6)];
    Note(absl::StrFormat("memory fraction %g", f));
    s = alloc_->SetMemoryFraction(f, 0);
  } else if (op < 90) {
    s = DoMove(in);
  } else if (op < 92) {
    if (std::uintptr_t p = PickLive(in); p != 0) {
      if (in.Next(2) == 0) {
        Note(absl::StrFormat("disposable %#x", p));
        s = alloc_->SetDisposable(reinterpret_cast<void*>(p), true);
        live_.at(p).disposable = true;
      } else {
        Note(absl::StrFormat("keep %#x", p));
        s = alloc_->SetKeep(reinterpret_cast<void*>(p), true);
        live_.at(p).keep = true;
      }
    }
  } else if (op < 94) {
    const Stream st = PickStream(in);
    if (Quiet()) {
      s = ExpectRefused(alloc_->Sleep(0, st).status(), "sleep");
    } else if (!asleep_) {
      s = DoSleep(st, static_cast<SleepLevel>(in.Next(3)));
    }
  } else if (op < 97) {
    const Stream st = PickStream(in);
    if (asleep_ && Quiet()) {
      s = ExpectRefused(alloc_->Wake(0, st).status(), "wake");
    } else if (asleep_) {
      Note(absl::StrFormat("wake on %d", st));
      discarding_ = Discarding::kWake;
      s = alloc_->Wake(0, st).status();
      if (s.ok()) s = CheckCalls();
      discarding_ = Discarding::kNone;
      asleep_ = false;
      for (auto& [p, l] : live_) {
        l.away = false;
        if (s.ok() && l.staged) {
          s = Violation(absl::StrFormat("wake left %#x's contents in the staging", p));
        }
      }
      if (s.ok()) s = CheckResident();
      if (s.ok()) s = CheckTags();
    }
  } else if (op < 98) {
    if (!Quiet()) {
      s = DoForget(in);
    } else {
      s = ExpectRefused(alloc_->ForgetStream(streams_[in.Next(kStreams)]), "forget_stream");
    }
  } else {
    s = DoAlloc(in);
  }
  if (!s.ok()) {
    return s.code() == absl::StatusCode::kFailedPrecondition ? s : Violation(s.ToString());
  }
  return AfterStep();
}

absl::Status ArenaChecker::AfterStep() {
  if (absl::Status c = CheckCalls(); !c.ok()) return c;
  if (CaptureOpen() && !alloc_->AllocatingToPool(0)) {
    return Violation("a capture's pool context is open and the allocator is not quiet");
  }
  if (absl::Status inv = alloc_->CheckInvariants(); !inv.ok()) {
    return Violation(absl::StrCat("invariants: ", inv.ToString()));
  }
  // Nothing here injects faults: every backend call the allocator makes
  // must be one the backend accepts (a discard range across two arenas,
  // a call on a destroyed stream, are not).
  if (const auto errors = alloc_->GetStats(0)->num_placement_errors; errors != 0) {
    return Violation(absl::StrFormat("%d backend placement calls failed", errors));
  }
  if (!asleep_) {
    const auto reserved = alloc_->GetStats(0)->reserved_bytes[kAllPools].current;
    // An away allocation's inner pages wait on the host, uncounted.
    absl::StatusOr<std::size_t> away = AwayPagesHeld();
    if (!away.ok()) return away.status();
    std::size_t held = backend_->PopulatedBytes(0) - *away;
    if (static_cast<std::size_t>(reserved) != held) {
      // A block freed while other streams still use it keeps its pages
      // until its free completes; a Sleep may have discarded them already.
      for (const SegmentSnapshot& seg : alloc_->Snapshot()) {
        for (const BlockSnapshot& b : seg.blocks) {
          if (b.state != "active_pending_free") continue;
          for (std::uintptr_t page = PageUp(b.address); page + kPageSize <= b.address + b.size;
               page += kPageSize) {
            // (A pool's own segment is not an arena: the backend counts it whole.)
            const void* at = reinterpret_cast<void*>(page);
            held += backend_->InReservedRange(at) &&
                            backend_->PageLocation(at) == kPageUnpopulated
                        ? kPageSize
                        : 0;
          }
        }
      }
    }
    if (static_cast<std::size_t>(reserved) != held) {
      return Violation(absl::StrFormat("reserved_bytes %d but the backend holds %d populated",
                                       reserved, held));
    }
  }
  if (std::getenv("CMA_CHECKER_TRACE") != nullptr) {
    fprintf(stderr, "%d: reserved %ld populated %zu asleep %d | %s\n", steps_,
            (long)alloc_->GetStats(0)->reserved_bytes[kAllPools].current,
            backend_->PopulatedBytes(0), asleep_, log_.empty() ? "" : log_.back().c_str());
  }
  Prune();
  return absl::OkStatus();
}

absl::Status ArenaChecker::Finish() {
  ++steps_;
  while (!contexts_.empty()) {
    const std::uint32_t pool = contexts_.back().pool;
    contexts_.pop_back();
    if (absl::Status e = alloc_->EndAllocateToPool(0, {pool, 0}); !e.ok()) return Violation(e.ToString());
  }
  for (auto& [pool, refs] : pool_refs_) {
    for (; refs > 0; --refs) {
      if (absl::Status r = alloc_->ReleasePool(0, {pool, 0}); !r.ok()) return Violation(r.ToString());
    }
  }
  while (!live_.empty()) {
    if (absl::Status s = DoFree(live_.begin()->first); !s.ok()) return s;
  }
  for (Stream s : streams_) {
    if (absl::Status c = backend_->CompleteWork(s); !c.ok()) return c;
  }
  Note("empty_cache at the end");
  if (absl::Status s = alloc_->EmptyCache(); !s.ok()) return Violation(s.ToString());
  if (absl::Status s = AfterStep(); !s.ok()) return s;
  const DeviceStats stats = *alloc_->GetStats(0);
  if (stats.reserved_bytes[kAllPools].current != 0 || backend_->PopulatedBytes(0) != 0) {
    return Violation("memory stays reserved after freeing everything and emptying the cache");
  }
  // The staging is what the statistics say, and goes with the allocator.
  if (static_cast<std::size_t>(stats.host_staging_bytes[kAllPools].current) !=
      backend_->LiveResources().pinned_bytes) {
    return Violation(absl::StrFormat("host_staging_bytes %d but %d bytes pinned",
                                     stats.host_staging_bytes[kAllPools].current,
                                     backend_->LiveResources().pinned_bytes));
  }
  alloc_.reset();
  const HostResourceCounts left = backend_->LiveResources();
  if (left.managed_allocations != 0 || left.events != 0 || left.pinned_allocations != 0) {
    return Violation(absl::StrFormat("leaked %d managed allocations, %d events and %d pinned "
                                     "buffers", left.managed_allocations, left.events,
                                     left.pinned_allocations));
  }
  return absl::OkStatus();
}

}  // namespace cma
