// The lower bound on the bytes a step moves, and the step's sizes
// (policy/offline_schedule.h).
//
// Why the bound holds. Call a *gap* of an allocation x (b bytes) the time
// strictly between two consecutive uses u < v of x whose data is needed at
// v. Let a schedule evict x somewhere in the gap, i.e. x is not resident at
// some time t with u < t < v. Then
//  - x must be fetched again in (t, v]: b bytes H2D, and fetches counted for
//    different gaps are different fetches (the gaps of one allocation are
//    disjoint, the fetch lies inside the gap);
//  - if the use at u wrote x (or created it), the host's copy is stale after
//    u, so x must be written back in (u, t): b bytes D2H, again one per gap.
// Let y_g in [0, b_g] be the bytes of gap g a schedule evicts (b_g or 0).
// At each kernel t the device holds the kernel's own allocations (W(t)
// bytes) and every gap spanning t that is not evicted, so
//     sum over gaps g spanning t of y_g  >=  W(t) + sum of their b_g - C.
// The least sum of y_g subject to these covering constraints (a linear
// program over intervals, its y_g fractional) is then at most the bytes of
// every schedule. Each direction is bounded on its own: for H2D every gap
// costs, for D2H only the gaps that start with a write; a gap that costs
// nothing in a direction is taken as evicted for free (dropping it from its
// constraints only relaxes them). Cold fetches (carried data that starts on
// the host) come before the first use, outside every gap, and are added.
//
// The covering LP is solved exactly by a sweep over time: at each kernel
// still short of room, evict (fractionally) the spanning gaps that end
// farthest first, just enough. Exchange argument: take an optimal solution
// that agrees with the sweep up to t. It covers t with at least the
// sweep's amount on gaps spanning t; moving its extra from gaps that end
// earlier to gaps that end later (both span t) keeps every constraint
// before t (the moved bytes were beyond the sweep's, which already covers
// them), keeps t, can only add coverage after t, and costs the same, so it
// agrees with the sweep up to t as well.
//
// A repeating step: in the steady state any K consecutive steps move at
// least LP_K, the bound of a window of K copies of the step in which a gap
// that enters the window from the step before costs only its fetch (its
// write-back may lie before the window) and one that leaves it only its
// write-back. Over many steps split into K-step windows the average is at
// least LP_K / K; the bound is the best of a few K (the windows may start at
// a step's start: the steady state is periodic, any phase of it will do).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <queue>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "policy/offline_schedule.h"

namespace cma {
namespace {

struct Gap {
  std::int64_t start = 0;  // a use's time, or -1: before the window
  std::int64_t end = 0;    // a use's time, or the window's length: after it
  std::uint64_t bytes = 0;
  bool h2d = false;     // evicting it inside the window costs a fetch inside
  bool d2h = false;     // ... costs a write-back inside
  bool needed = false;  // its data is needed later: keeping everything means keeping it
};

// K copies of the step, back to back, in event time.
struct Window {
  std::int64_t length = 0;
  std::vector<std::uint64_t> kernel_bytes;  // per event: its kernel's bytes (0: no kernel)
  std::vector<bool> is_use;
  std::vector<Gap> gaps;
  std::uint64_t cold_h2d = 0;
};

struct UseOf {
  std::int64_t event;
  bool writes;  // or creates
};

std::vector<std::vector<UseOf>> UsesByAllocation(const Step& step) {
  std::vector<std::vector<UseOf>> uses(step.allocations().size());
  const auto& events = step.events();
  for (std::int64_t e = 0; e < static_cast<std::int64_t>(events.size()); ++e) {
    if (events[e].kind != Step::Kind::kUse) continue;
    for (std::int64_t k = events[e].access_begin; k < events[e].access_end; ++k) {
      const Step::Access& a = step.accesses()[k];
      auto& list = uses[a.allocation];
      // An allocation made in the step is created by its first use.
      const bool creates = list.empty() && !step.allocations()[a.allocation].carried;
      list.push_back({e, a.writes || creates});
    }
  }
  return uses;
}

Window BuildWindow(const Step& step, bool repeat, int copies) {
  const std::int64_t n = static_cast<std::int64_t>(step.events().size());
  Window w;
  w.length = n * copies;
  w.kernel_bytes.assign(w.length, 0);
  w.is_use.assign(w.length, false);
  for (int k = 0; k < copies; ++k) {
    for (std::int64_t e = 0; e < n; ++e) {
      const Step::Event& ev = step.events()[e];
      if (ev.kind != Step::Kind::kUse) continue;
      w.is_use[k * n + e] = true;
      for (std::int64_t i = ev.access_begin; i < ev.access_end; ++i) {
        w.kernel_bytes[k * n + e] += step.allocations()[step.accesses()[i].allocation].bytes;
      }
    }
  }
  const std::vector<std::vector<UseOf>> uses = UsesByAllocation(step);
  for (std::size_t a = 0; a < uses.size(); ++a) {
    const auto& u = uses[a];
    if (u.empty()) continue;
    const Step::Allocation& al = step.allocations()[a];
    const std::uint64_t b = al.bytes;
    for (int k = 0; k < copies; ++k) {
      const std::int64_t base = k * n;
      for (std::size_t i = 0; i + 1 < u.size(); ++i) {
        w.gaps.push_back({base + u[i].event, base + u[i + 1].event, b, true, u[i].writes, true});
      }
      const UseOf& last = u.back();
      if (!al.persistent()) {
        if (al.carried) w.cold_h2d += b;  // freed later: starts on the host
        continue;
      }
      if (!repeat) {  // kept after its last use, never fetched again
        w.cold_h2d += b;
        // Keeping it saves a write-back if any use wrote it; only a write at
        // the last use forces one when it is evicted.
        const bool written = std::any_of(u.begin(), u.end(), [](const UseOf& x) { return x.writes; });
        w.gaps.push_back({base + last.event, w.length, b, false, last.writes, written});
        continue;
      }
      if (k == 0) w.gaps.push_back({-1, u.front().event, b, true, false, true});
      if (k + 1 < copies) {
        w.gaps.push_back({base + last.event, base + n + u.front().event, b, true, last.writes,
                          true});
      } else {
        w.gaps.push_back({base + last.event, w.length, b, false, last.writes, true});
      }
    }
  }
  return w;
}

// The least sum of evicted bytes over the gaps that cost in this direction
// (`costs`), subject to every kernel's room (the comment at the top).
std::uint64_t CoverCost(const Window& w, std::uint64_t capacity, bool Gap::*costs) {
  std::vector<std::int32_t> order;
  std::vector<std::int64_t> spanning_diff(w.length + 1, 0);
  for (std::size_t g = 0; g < w.gaps.size(); ++g) {
    const Gap& gap = w.gaps[g];
    if (!(gap.*costs) || gap.end - gap.start < 2) continue;  // spans no time
    order.push_back(static_cast<std::int32_t>(g));
    spanning_diff[gap.start + 1] += static_cast<std::int64_t>(gap.bytes);
    spanning_diff[gap.end] -= static_cast<std::int64_t>(gap.bytes);
  }
  std::sort(order.begin(), order.end(),
            [&](std::int32_t x, std::int32_t y) { return w.gaps[x].start < w.gaps[y].start; });
  std::vector<std::uint64_t> remaining(w.gaps.size(), 0);
  std::vector<std::int64_t> expire(w.length + 1, 0);
  std::priority_queue<std::pair<std::int64_t, std::int32_t>> open;  // (end, gap): farthest on top
  std::size_t next = 0;
  std::int64_t spanning = 0, covered = 0;
  std::uint64_t total = 0;
  for (std::int64_t t = 0; t < w.length; ++t) {
    spanning += spanning_diff[t];
    covered -= expire[t];
    for (; next < order.size() && w.gaps[order[next]].start < t; ++next) {
      remaining[order[next]] = w.gaps[order[next]].bytes;
      open.push({w.gaps[order[next]].end, order[next]});
    }
    if (!w.is_use[t]) continue;
    std::int64_t deficit = static_cast<std::int64_t>(w.kernel_bytes[t]) + spanning -
                           static_cast<std::int64_t>(capacity) - covered;
    while (deficit > 0 && !open.empty()) {
      const auto [end, g] = open.top();
      if (end <= t) {  // ended: spans nothing from here on
        open.pop();
        continue;
      }
      const std::int64_t take = std::min<std::int64_t>(remaining[g], deficit);
      remaining[g] -= take;
      covered += take;
      expire[end] += take;
      deficit -= take;
      total += take;
      if (remaining[g] == 0) open.pop();
    }
  }
  return total;
}

absl::Status CheckKernelsFit(const Step& step, std::uint64_t capacity) {
  const Window w = BuildWindow(step, false, 1);
  for (std::int64_t t = 0; t < w.length; ++t) {
    if (w.kernel_bytes[t] > capacity) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the kernel at event %d needs %d bytes at once; the device part is %d bytes", t,
          w.kernel_bytes[t], capacity));
    }
  }
  return absl::OkStatus();
}

}  // namespace

StepFacts MeasureStep(const Step& step, bool repeat) {
  StepFacts f;
  std::uint64_t live = 0;
  for (const Step::Allocation& a : step.allocations()) {
    if (a.carried) live += a.bytes;
    if (a.carried && a.free_event >= 0 && a.first_use >= 0) {
      ++f.carried_freed_used;
      f.carried_freed_used_bytes += a.bytes;
    }
  }
  f.live_peak = live;
  for (const Step::Event& e : step.events()) {
    if (e.kind == Step::Kind::kAlloc) {
      live += step.allocations()[e.allocation].bytes;
      f.live_peak = std::max<std::size_t>(f.live_peak, live);
    } else if (e.kind == Step::Kind::kFree) {
      live -= step.allocations()[e.allocation].bytes;
    } else {
      ++f.uses;
    }
  }
  const Window w = BuildWindow(step, repeat, 1);
  std::vector<std::int64_t> diff(w.length + 1, 0);
  for (const Gap& g : w.gaps) {
    if (!g.needed || g.end - g.start < 2) continue;
    diff[g.start + 1] += static_cast<std::int64_t>(g.bytes);
    diff[g.end] -= static_cast<std::int64_t>(g.bytes);
  }
  std::int64_t spanning = 0;
  for (std::int64_t t = 0; t < w.length; ++t) {
    spanning += diff[t];
    if (!w.is_use[t]) continue;
    f.largest_use = std::max<std::size_t>(f.largest_use, w.kernel_bytes[t]);
    f.working_peak = std::max<std::size_t>(f.working_peak, w.kernel_bytes[t] + spanning);
  }
  return f;
}

absl::StatusOr<LinkLowerBound> LowerBoundLinkBytes(const Step& step,
                                                   const ScheduleOptions& options) {
  absl::Status fits = CheckKernelsFit(step, options.device_bytes);
  if (!fits.ok()) return fits;
  LinkLowerBound bound;
  // One step alone has one window. A repeating one: LP_K / K misses at most
  // the bytes of the gaps that cross the window's two ends (every
  // persistent allocation's, about) over K, so the windows double up to
  // max_bound_steps while K copies stay within a few million gaps.
  std::vector<int> windows = {1};
  if (options.repeat) {
    const std::size_t per_copy = std::max<std::size_t>(
        1, step.accesses().size() + step.events().size());
    constexpr std::size_t kMaxItems = std::size_t{1} << 22;
    for (int k = 2; k <= options.max_bound_steps && per_copy * k <= kMaxItems; k *= 2) {
      windows.push_back(k);
    }
  }
  for (int k : windows) {
    const Window w = BuildWindow(step, options.repeat, k);
    const double h2d =
        static_cast<double>(w.cold_h2d + CoverCost(w, options.device_bytes, &Gap::h2d)) / k;
    const double d2h = static_cast<double>(CoverCost(w, options.device_bytes, &Gap::d2h)) / k;
    if (h2d >= bound.h2d) bound.window_steps = k;
    bound.h2d = std::max(bound.h2d, h2d);
    bound.d2h = std::max(bound.d2h, d2h);
    bound.cold_h2d = static_cast<double>(w.cold_h2d) / k;
  }
  return bound;
}

}  // namespace cma
