// ArenaChecker's private-pool steps (tests/arena_checker.h): begin, end
// and release a pool, take and restore its checkpoint, the routing the
// allocator must follow, and which pools' freed ranges still bind it.
#include <algorithm>
#include <iterator>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "policy/size_policy.h"
#include "tests/arena_checker.h"

namespace cma {
namespace {

bool Overlaps(std::uintptr_t lo1, std::uintptr_t hi1, std::uintptr_t lo2, std::uintptr_t hi2) {
  return lo1 < hi2 && lo2 < hi1;
}

}  // namespace

absl::Status ArenaChecker::ExpectRefused(const absl::Status& s, const char* what) {
  Note(absl::StrFormat("%s while a pool is allocated to", what));
  if (s.code() == absl::StatusCode::kFailedPrecondition) return absl::OkStatus();
  return Violation(absl::StrFormat("%s while a pool is being allocated to returned %s, not a "
                                   "refusal", what, s.ToString()));
}

std::uint32_t ArenaChecker::Route(Stream s) const {
  for (auto c = contexts_.rbegin(); c != contexts_.rend(); ++c) {
    if (c->all || c->only == s) return c->pool;
  }
  return 0;
}

bool ArenaChecker::CaptureOpen() const {
  return std::any_of(contexts_.begin(), contexts_.end(), [](const Context& c) { return c.capture; });
}

bool ArenaChecker::Quiet() const { return CaptureOpen() || alloc_->AllocatingToPool(0); }

bool ArenaChecker::Released(std::uint32_t pool) const {
  auto refs = pool_refs_.find(pool);
  if (refs != pool_refs_.end() && refs->second > 0) return false;
  for (const Context& c : contexts_) {
    if (c.pool == pool) return false;
  }
  return true;
}

void ArenaChecker::ForgetDissolvedPools() {
  // A released pool's free ranges are its no longer, even while some of its
  // blocks live on: its wholly free segments may be given back and handed
  // out again (and a pool revived under the same id starts afresh).
  for (auto it = pool_free_.begin(); it != pool_free_.end();) {
    it = Released(it->first) ? pool_free_.erase(it) : std::next(it);
  }
  for (auto it = captured_.begin(); it != captured_.end();) {
    it = Released(*it) ? captured_.erase(it) : std::next(it);
  }
}

absl::Status ArenaChecker::DoPoolStep(StepSource& in) {
  const std::uint32_t pool = 1 + in.Next(2);
  const MemPoolId id{pool, 0};
  const std::uint32_t op = in.Next(pool_checkpoints_ ? 6 : 3);
  if (op == 3) return DoTakeCheckpoint(in, pool);
  if (op >= 4) return DoRestoreCheckpoint(pool);
  switch (op) {
    case 0: {
      if (contexts_.size() >= 2) return absl::OkStatus();
      const bool all = in.Next(3) == 0;
      const Stream only = streams_[in.Next(kStreams)];
      // Pool 2's every-stream contexts are use_mem_pool's (no capture),
      // derived rather than drawn so that the corpus keeps its meaning.
      const bool capture = !(all && pool == 2) || captured_.count(pool) != 0;
      if (capture) captured_.insert(pool);
      Note(absl::StrFormat("begin pool %d for %s%s", pool,
                           all ? std::string("every stream") : absl::StrCat("stream ", only),
                           capture ? "" : " (no capture)"));
      StreamFilter filter;
      if (!all) filter = [only](Stream s) { return s == only; };
      PoolContextOptions options;
      options.not_a_capture = !capture;
      if (absl::Status b = alloc_->BeginAllocateToPool(0, id, std::move(filter), options);
          !b.ok()) {
        return Violation(absl::StrCat("begin failed: ", b.ToString()));
      }
      ++pool_refs_[pool];
      contexts_.push_back({pool, only, all, capture});
      return absl::OkStatus();
    }
    case 1: {
      auto c = std::find_if(contexts_.begin(), contexts_.end(),
                            [&](const Context& x) { return x.pool == pool; });
      if (c == contexts_.end()) return absl::OkStatus();
      Note(absl::StrFormat("end pool %d", pool));
      if (c->capture) {  // a context of the pool nested in a capture's: the capture goes on
        for (auto n = std::next(c); n != contexts_.end(); ++n) {
          if (n->pool == pool && !n->capture) {
            n->capture = true;
            break;
          }
        }
      }
      contexts_.erase(c);
      if (absl::Status e = alloc_->EndAllocateToPool(0, id); !e.ok()) {
        return Violation(absl::StrCat("end failed: ", e.ToString()));
      }
      ForgetDissolvedPools();
      return CheckCalls();  // deferred frees record their events now
    }
    default: {
      if (pool_refs_[pool] == 0) return absl::OkStatus();
      Note(absl::StrFormat("release pool %d", pool));
      --pool_refs_[pool];
      if (absl::Status r = alloc_->ReleasePool(0, id); !r.ok()) {
        return Violation(absl::StrCat("release failed: ", r.ToString()));
      }
      ForgetDissolvedPools();
      return absl::OkStatus();
    }
  }
}

absl::Status ArenaChecker::DoTakeCheckpoint(StepSource& in, std::uint32_t pool) {
  const MemPoolId id{pool, 0};
  absl::StatusOr<PoolCheckpoint> cp = alloc_->TakePoolCheckpoint(0, id);
  Note(absl::StrFormat("checkpoint pool %d -> %s", pool,
                       cp.ok() ? absl::StrCat(cp->allocations.size(), " allocations")
                               : cp.status().ToString()));
  if (pool_refs_[pool] == 0) {
    // Unknown, or released (PyTorch does not checkpoint a freeable pool).
    if (cp.ok()) return Violation("checkpoint of a pool with no reference was taken");
    return absl::OkStatus();
  }
  if (!cp.ok()) return Violation(absl::StrCat("checkpoint failed: ", cp.status().ToString()));
  std::set<std::uintptr_t> model;
  for (const auto& [p, l] : live_) {
    if (l.pool == pool) model.insert(p);
  }
  std::set<std::uintptr_t> got;
  for (const PoolAllocation& a : cp->allocations) {
    const auto p = reinterpret_cast<std::uintptr_t>(a.ptr);
    got.insert(p);
    auto l = live_.find(p);
    if (l == live_.end() || l->second.pool != pool || l->second.size != a.requested ||
        l->second.stream != a.stream) {
      return Violation(absl::StrFormat("checkpoint of pool %d lists %#x (+%d on %d), which the "
                                       "model does not have live there", pool, p, a.requested,
                                       a.stream));
    }
  }
  if (got != model) {
    return Violation(absl::StrFormat("checkpoint of pool %d has %d allocations, the model %d",
                                     pool, got.size(), model.size()));
  }
  checkpoints_[pool] = *cp;
  // Now and then restored at once: nothing changed, so it must succeed and
  // keep everything in place.
  if (in.Next(3) != 0 || Quiet() || asleep_) return absl::OkStatus();
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(*cp);
  if (!r.ok()) {
    return Violation(absl::StrCat("restore right after the take failed: ", r.status().ToString()));
  }
  if (r->kept.size() != cp->allocations.size() || r->freed.size() != cp->allocations.size()) {
    return Violation("restore right after the take moved allocations");
  }
  return CheckCalls();
}

absl::Status ArenaChecker::DoRestoreCheckpoint(std::uint32_t pool) {
  auto saved = checkpoints_.find(pool);
  if (saved == checkpoints_.end() || asleep_) return absl::OkStatus();
  const PoolCheckpoint& cp = saved->second;
  if (Quiet()) {
    // Refused while recording; a cudagraph tree restores between recordings.
    absl::Status refused = ExpectRefused(alloc_->RestorePoolCheckpoint(cp).status(), "restore");
    if (!refused.ok()) return refused;
    while (!contexts_.empty()) {
      const std::uint32_t open = contexts_.back().pool;
      Note(absl::StrFormat("end pool %d", open));
      contexts_.pop_back();
      if (absl::Status e = alloc_->EndAllocateToPool(0, {open, 0}); !e.ok()) {
        return Violation(absl::StrCat("end failed: ", e.ToString()));
      }
    }
    ForgetDissolvedPools();
    if (absl::Status c = CheckCalls(); !c.ok()) return c;
  }
  Note(absl::StrFormat("restore pool %d (%d allocations)", pool, cp.allocations.size()));
  // What each stream had queued before the restore: the last uses of the
  // blocks it frees (the restore may queue waits on those streams itself).
  absl::flat_hash_map<Stream, std::int64_t> submitted_before;
  submitted_before[kDefaultStream] = Submitted(kDefaultStream);
  for (Stream u : streams_) submitted_before[u] = Submitted(u);
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(cp);
  if (absl::Status c = CheckCalls(); !c.ok()) return c;
  std::vector<void*> before;
  for (const auto& [p, l] : live_) {
    if (l.pool == pool) before.push_back(reinterpret_cast<void*>(p));
  }
  if (!r.ok()) {
    Note(absl::StrCat("restore refused: ", r.status().ToString()));
    // Refused: the pool's allocations are as they were.
    if (pool_refs_[pool] > 0) {
      absl::StatusOr<bool> same = alloc_->CheckPoolLiveAllocations(0, {pool, 0}, before);
      if (!same.ok() || !*same) return Violation("a refused restore changed the pool");
    }
    return absl::OkStatus();
  }
  if (pool_refs_[pool] == 0) return Violation("restore of a pool with no reference went ahead");
  // Reported: every allocation live in the pool before, then the checkpoint's.
  std::set<void*> freed, want(before.begin(), before.end());
  for (const PoolAllocation& a : r->freed) freed.insert(a.ptr);
  if (freed != want || r->created.size() != cp.allocations.size()) {
    return Violation(absl::StrFormat("restore reported %d freed (model %d) and %d created "
                                     "(checkpoint %d)", freed.size(), want.size(),
                                     r->created.size(), cp.allocations.size()));
  }
  const std::set<void*> kept(r->kept.begin(), r->kept.end());
  Note(absl::StrFormat("restored: %d freed, %d created, %d kept", r->freed.size(),
                       r->created.size(), kept.size()));
  // The model frees what the restore freed.
  for (void* v : before) {
    const auto p = reinterpret_cast<std::uintptr_t>(v);
    if (kept.count(v) != 0) continue;
    const Live l = live_.at(p);
    if (!l.dead && !TagIntact(p, l)) {
      return Violation(absl::StrFormat("the contents of live %#x (+%d) changed", p, l.size));
    }
    live_.erase(p);
    pool_free_[pool].push_back({p, p + l.size});
    std::vector<Stream> users = l.uses;
    users.push_back(l.stream);
    for (Stream u : users) {
      auto known = submitted_before.find(u);
      retired_.push_back(
          {p, p + l.size, u, known == submitted_before.end() ? Submitted(u) : known->second});
    }
  }
  for (const PoolAllocation& a : cp.allocations) {
    const auto p = reinterpret_cast<std::uintptr_t>(a.ptr);
    const std::uintptr_t end = p + a.size;
    if (kept.count(a.ptr) != 0) {
      Live& l = live_.at(p);
      if (a.stream != l.stream) {
        if (std::find(l.uses.begin(), l.uses.end(), l.stream) == l.uses.end()) {
          l.uses.push_back(l.stream);
        }
        l.uses.erase(std::remove(l.uses.begin(), l.uses.end(), a.stream), l.uses.end());
        l.stream = a.stream;
      }
      l.size = a.requested;
      l.tag = next_tag_++;  // the replay's outputs
      if (!l.dead) WriteTag(p, l);
      continue;
    }
    for (const auto& [q, l] : live_) {
      if (Overlaps(p, end, q, q + l.size)) {
        return Violation(absl::StrFormat("restore re-created %#x (+%d) over live %#x (+%d)", p,
                                         a.size, q, l.size));
      }
    }
    for (const Use& u : retired_) {
      if (u.stream != a.stream && Overlaps(p, end, u.lo, u.hi) &&
          !Ordered(a.stream, u.stream, u.ticket)) {
        return Violation(absl::StrFormat("restore re-created %#x (+%d) on stream %d while "
                                         "stream %d may still use [%#x, %#x)", p, a.size,
                                         a.stream, u.stream, u.lo, u.hi));
      }
    }
    if (absl::Status c = CheckPopulation(p, end, a.stream); !c.ok()) return c;
    for (auto& [other, ranges] : pool_free_) {
      for (auto f = ranges.begin(); f != ranges.end();) {
        if (!Overlaps(p, end, f->first, f->second)) {
          ++f;
          continue;
        }
        if (other != pool) {
          return Violation(absl::StrFormat("restore re-created %#x (+%d) for pool %d over "
                                           "[%#x, %#x), freed into pool %d", p, a.size, pool,
                                           f->first, f->second, other));
        }
        const auto [lo, hi] = *f;
        f = ranges.erase(f);
        if (lo < p) f = ranges.insert(f, {lo, p}) + 1;
        if (end < hi) f = ranges.insert(f, {end, hi}) + 1;
      }
    }
    backend_->Touch(reinterpret_cast<void*>(p), a.size, 0);  // the replay writes it
    Live l{a.requested, a.stream, {}, next_tag_++};
    l.pool = pool;
    WriteTag(p, l);
    live_.emplace(p, std::move(l));
  }
  return absl::OkStatus();
}

}  // namespace cma
