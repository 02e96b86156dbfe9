// ArenaChecker's private-pool steps (tests/arena_checker.h): begin, end
// and release a pool, the routing the allocator must follow, and which
// pools' freed ranges still bind it.
#include <algorithm>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/arena_checker.h"

namespace cma {
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

void ArenaChecker::ForgetDissolvedPools() {
  for (auto it = pool_free_.begin(); it != pool_free_.end();) {
    const std::uint32_t pool = it->first;
    bool alive = pool_refs_[pool] > 0;
    for (const Context& c : contexts_) alive = alive || c.pool == pool;
    for (const auto& [p, l] : live_) alive = alive || l.pool == pool;
    it = alive ? std::next(it) : pool_free_.erase(it);
  }
}

absl::Status ArenaChecker::DoPoolStep(StepSource& in) {
  const std::uint32_t pool = 1 + in.Next(2);
  const MemPoolId id{pool, 0};
  switch (in.Next(3)) {
    case 0: {
      if (contexts_.size() >= 2) return absl::OkStatus();
      const bool all = in.Next(3) == 0;
      const Stream only = streams_[in.Next(kStreams)];
      Note(absl::StrFormat("begin pool %d for %s", pool,
                           all ? std::string("every stream") : absl::StrCat("stream ", only)));
      StreamFilter filter;
      if (!all) filter = [only](Stream s) { return s == only; };
      if (absl::Status b = alloc_->BeginAllocateToPool(0, id, std::move(filter)); !b.ok()) {
        return Violation(absl::StrCat("begin failed: ", b.ToString()));
      }
      ++pool_refs_[pool];
      contexts_.push_back({pool, only, all});
      return absl::OkStatus();
    }
    case 1: {
      auto c = std::find_if(contexts_.begin(), contexts_.end(),
                            [&](const Context& x) { return x.pool == pool; });
      if (c == contexts_.end()) return absl::OkStatus();
      Note(absl::StrFormat("end pool %d", pool));
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

}  // namespace cma
