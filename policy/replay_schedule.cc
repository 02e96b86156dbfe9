// The replay schedule (policy/replay_schedule.h).
//
// Time is the step's events, 0..n-1, on a cycle: the step repeats, so a
// stretch that begins before event 0 (a persistent allocation's gap from its
// last use to its first) is written with negative indices, t < 0 standing
// for event t + n of the step before, which is the same plan. Bytes are
// int64 throughout so that a count can go down and up again.
#include "policy/replay_schedule.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace cma {
namespace {

using Index = std::int64_t;

// Calls f(begin, end) for the linear pieces of the cyclic stretch [a, e) of
// n events, a in (-n, e], e in [0, n]: the piece in the step before first.
template <typename F>
void ForPieces(Index n, Index a, Index e, F f) {
  if (a < 0) {
    f(a + n, n);
    if (e > 0) f(0, e);
  } else if (a < e) {
    f(a, e);
  }
}

// Range add and range max over event slots, and the last slot of a range
// above a threshold (where a bring-back issued earlier would not fit).
// A node's max includes its own pending add; its children's do not.
class MaxTree {
 public:
  explicit MaxTree(const std::vector<std::int64_t>& values)
      : n_(static_cast<Index>(values.size())), max_(4 * n_ + 4, 0), add_(4 * n_ + 4, 0) {
    if (n_ > 0) Build(1, 0, n_, values);
  }
  void Add(Index l, Index r, std::int64_t d) {
    if (l < r) Add(1, 0, n_, l, r, d);
  }
  std::int64_t Max(Index l, Index r) const {
    return l < r ? Max(1, 0, n_, l, r) : kNone;
  }
  // The last slot in [l, r) whose value exceeds x, or -1.
  Index LastAbove(Index l, Index r, std::int64_t x) const {
    return l < r ? LastAbove(1, 0, n_, l, r, x) : -1;
  }

 private:
  static constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::min() / 4;

  void Build(Index node, Index nl, Index nr, const std::vector<std::int64_t>& v) {
    if (nr - nl == 1) {
      max_[node] = v[nl];
      return;
    }
    const Index mid = (nl + nr) / 2;
    Build(2 * node, nl, mid, v);
    Build(2 * node + 1, mid, nr, v);
    max_[node] = std::max(max_[2 * node], max_[2 * node + 1]);
  }
  void Add(Index node, Index nl, Index nr, Index l, Index r, std::int64_t d) {
    if (r <= nl || nr <= l) return;
    if (l <= nl && nr <= r) {
      max_[node] += d;
      add_[node] += d;
      return;
    }
    const Index mid = (nl + nr) / 2;
    Add(2 * node, nl, mid, l, r, d);
    Add(2 * node + 1, mid, nr, l, r, d);
    max_[node] = std::max(max_[2 * node], max_[2 * node + 1]) + add_[node];
  }
  std::int64_t Max(Index node, Index nl, Index nr, Index l, Index r) const {
    if (r <= nl || nr <= l) return kNone;
    if (l <= nl && nr <= r) return max_[node];
    const Index mid = (nl + nr) / 2;
    return std::max(Max(2 * node, nl, mid, l, r), Max(2 * node + 1, mid, nr, l, r)) +
           add_[node];
  }
  Index LastAbove(Index node, Index nl, Index nr, Index l, Index r, std::int64_t x) const {
    if (r <= nl || nr <= l || max_[node] <= x) return -1;
    if (nr - nl == 1) return nl;
    const Index mid = (nl + nr) / 2;
    const Index p = LastAbove(2 * node + 1, mid, nr, l, r, x - add_[node]);
    return p >= 0 ? p : LastAbove(2 * node, nl, mid, l, r, x - add_[node]);
  }

  Index n_;
  std::vector<std::int64_t> max_, add_;
};

struct UseOf {
  Index event;
  bool writes;  // or creates
};

// A stretch (u, v) between two uses in which an allocation may be away:
// sent at u + 1, brought back at `bring` in [u + 2, v].
struct Gap {
  std::int32_t allocation = 0;
  Index u = 0;  // the use before (negative: the step before; -1 also for a carried head)
  Index v = 0;  // the use it serves, in [0, n)
  int after_use = 0;  // index of the use at u in the allocation's uses (-1: carried head)
  bool away = false;
  Index bring = 0;
  bool write_back = false;
};

struct Model {
  Index n = 0;
  std::vector<std::vector<UseOf>> uses;       // per allocation
  std::vector<std::vector<std::int32_t>> gaps_of;  // per allocation, in time order
  std::vector<Gap> gaps;
  std::vector<std::int64_t> present;  // per event: bytes counted with nothing away
  std::vector<std::int64_t> kernel;   // per event: its kernel's bytes
  std::vector<bool> read_only;        // per allocation: persistent, never written
  std::vector<std::uint64_t> host_for_good;
};

Model BuildModel(const Step& step) {
  const auto& allocs = step.allocations();
  const auto& events = step.events();
  Model m;
  m.n = static_cast<Index>(events.size());
  m.uses.resize(allocs.size());
  m.gaps_of.resize(allocs.size());
  m.kernel.assign(m.n, 0);
  for (Index e = 0; e < m.n; ++e) {
    if (events[e].kind != Step::Kind::kUse) continue;
    for (Index k = events[e].access_begin; k < events[e].access_end; ++k) {
      const Step::Access& acc = step.accesses()[k];
      auto& list = m.uses[acc.allocation];
      list.push_back({e, acc.writes || (list.empty() && !allocs[acc.allocation].carried)});
      m.kernel[e] += static_cast<std::int64_t>(allocs[acc.allocation].bytes);
    }
  }
  std::vector<std::int64_t> diff(m.n + 1, 0);
  m.read_only.assign(allocs.size(), false);
  for (std::size_t a = 0; a < allocs.size(); ++a) {
    const Step::Allocation& al = allocs[a];
    const auto& u = m.uses[a];
    const std::int64_t b = static_cast<std::int64_t>(al.bytes);
    if (al.persistent() && u.empty()) {
      // What a send leaves (its shared edge pages, or all of it when it
      // cannot leave) stays on the device for the whole step.
      const std::int64_t stays = static_cast<std::int64_t>(al.bytes - al.movable_bytes());
      diff[0] += stays;
      diff[m.n] -= stays;
      if (al.movable_bytes() > 0) m.host_for_good.push_back(al.id);
      continue;
    }
    const Index from = al.carried ? 0 : al.alloc_event;
    const Index to = al.free_event >= 0 ? al.free_event : m.n - 1;
    diff[from] += b;
    diff[to + 1] -= b;
    m.read_only[a] = al.persistent() &&
                     std::none_of(u.begin(), u.end(), [](const UseOf& x) { return x.writes; });
    auto add_gap = [&](Index from_use, Index to_use, int after) {
      if (to_use - from_use < 2) return;  // no event between: it cannot be away
      if (al.movable_bytes() == 0) return;  // nothing of it can leave
      m.gaps_of[a].push_back(static_cast<std::int32_t>(m.gaps.size()));
      Gap g;
      g.allocation = static_cast<std::int32_t>(a);
      g.u = from_use;
      g.v = to_use;
      g.after_use = after;
      m.gaps.push_back(g);
    };
    if (u.empty()) continue;
    if (al.carried && !al.persistent()) add_gap(-1, u.front().event, -1);
    for (std::size_t i = 0; i + 1 < u.size(); ++i) {
      add_gap(u[i].event, u[i + 1].event, static_cast<int>(i));
    }
    if (al.persistent()) {
      add_gap(u.back().event - m.n, u.front().event, static_cast<int>(u.size()) - 1);
    }
  }
  m.present.assign(m.n, 0);
  std::int64_t running = 0;
  for (Index e = 0; e < m.n; ++e) m.present[e] = running += diff[e];
  return m;
}

std::string Bytes(std::int64_t b) {
  return absl::StrFormat("%d bytes (%.3f GiB)", b, static_cast<double>(b) / (1 << 30));
}

// Per event: the bytes that no move can take off the device.
std::vector<std::int64_t> Floor(const Model& m, const Step& step) {
  std::vector<std::int64_t> diff(m.n + 1, 0);
  for (const Gap& g : m.gaps) {
    const std::int64_t b =
        static_cast<std::int64_t>(step.allocations()[g.allocation].movable_bytes());
    ForPieces(m.n, g.u + 1, g.v, [&](Index l, Index r) {
      diff[l] -= b;
      diff[r] += b;
    });
  }
  std::vector<std::int64_t> floor(m.n);
  std::int64_t running = 0;
  for (Index e = 0; e < m.n; ++e) floor[e] = m.present[e] + (running += diff[e]);
  return floor;
}

// Pass 1: Belady's choice with earliest sends and demand bring-backs.
absl::Status ChooseAway(const Step& step, std::int64_t capacity, Index start, Model& m) {
  const auto& allocs = step.allocations();
  // In this pass only, slot t is event (t + start) mod n.
  struct Piece {
    Index begin, end;  // the slots [begin, end) of one gap's stretch
    Index next_use;    // its use's slot (+ n: a use in the next lap)
    std::int32_t gap;
  };
  // A gap's stretch in slots: [from, end), end in (0, n].
  auto lap = [&](const Gap& gap) {
    Index end = ((gap.v - start) % m.n + m.n) % m.n;
    if (end == 0) end = m.n;
    return std::make_pair(end - (gap.v - gap.u - 1), end);
  };
  std::vector<Piece> pieces;
  for (std::size_t g = 0; g < m.gaps.size(); ++g) {
    // (Named pairs, not bindings: C++17 lambdas cannot capture those.)
    const std::pair<Index, Index> span = lap(m.gaps[g]);
    const Index from = span.first, end = span.second;
    ForPieces(m.n, from, end, [&](Index l, Index r) {
      // The piece before the lap's end serves the next lap's use.
      pieces.push_back({l, r, l >= end ? end + m.n : end, static_cast<std::int32_t>(g)});
    });
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& x, const Piece& y) { return x.begin < y.begin; });
  // The best victim on top: farthest next use, then larger, then read-only.
  auto worse = [&](const Piece& x, const Piece& y) {
    if (x.next_use != y.next_use) return x.next_use < y.next_use;
    const std::size_t bx = allocs[m.gaps[x.gap].allocation].movable_bytes();
    const std::size_t by = allocs[m.gaps[y.gap].allocation].movable_bytes();
    if (bx != by) return bx < by;
    const bool rx = m.read_only[m.gaps[x.gap].allocation];
    const bool ry = m.read_only[m.gaps[y.gap].allocation];
    if (rx != ry) return !rx;
    return x.gap > y.gap;
  };
  std::priority_queue<Piece, std::vector<Piece>, decltype(worse)> open(worse);
  // relief: bytes away at the current event; delta: changes still to come.
  std::vector<std::int64_t> delta(m.n + 1, 0);
  std::int64_t relief = 0;
  std::size_t next = 0;
  for (Index t = 0; t < m.n; ++t) {
    relief += delta[t];
    for (; next < pieces.size() && pieces[next].begin <= t; ++next) open.push(pieces[next]);
    while (m.present[(t + start) % m.n] + relief > capacity) {
      if (open.empty()) {  // Floor() said the room is there.
        return absl::InternalError(
            absl::StrFormat("no allocation can leave at event %d", (t + start) % m.n));
      }
      const Piece p = open.top();
      open.pop();
      Gap& gap = m.gaps[p.gap];
      if (p.end <= t || gap.away) continue;  // over, or already away
      gap.away = true;
      gap.bring = gap.v;
      const std::int64_t b = static_cast<std::int64_t>(allocs[gap.allocation].movable_bytes());
      // Away over its whole stretch: now, later in the lap, and (no matter
      // to the sweep) earlier.
      const auto [from, end] = lap(gap);
      ForPieces(m.n, from, end, [&](Index l, Index r) {
        if (r <= t) return;
        if (l <= t) {
          relief -= b;
        } else {
          delta[l] -= b;
        }
        delta[r] += b;
      });
    }
  }
  return absl::OkStatus();
}

// The count per event with every chosen gap away until its use (a demand
// bring-back), as a tree the later passes query and add to.
MaxTree CountWithAway(const Step& step, const Model& m) {
  std::vector<std::int64_t> diff(m.n + 1, 0);
  for (const Gap& g : m.gaps) {
    if (!g.away) continue;
    const std::int64_t b =
        static_cast<std::int64_t>(step.allocations()[g.allocation].movable_bytes());
    ForPieces(m.n, g.u + 1, g.v, [&](Index l, Index r) {
      diff[l] -= b;
      diff[r] += b;
    });
  }
  std::vector<std::int64_t> count = m.present;
  std::int64_t running = 0;
  for (Index e = 0; e < m.n; ++e) count[e] += running += diff[e];
  return MaxTree(count);
}

std::vector<std::int32_t> AwayGaps(const Model& m) {
  std::vector<std::int32_t> away;
  for (std::size_t g = 0; g < m.gaps.size(); ++g) {
    if (m.gaps[g].away) away.push_back(static_cast<std::int32_t>(g));
  }
  return away;
}

// Pass 2: a gap that fits after all (pass 1's later choices made its room)
// stays, the largest first: every byte kept is a byte each way not moved.
void KeepWhatFits(const Step& step, std::int64_t capacity, Model& m, MaxTree& count) {
  const auto& allocs = step.allocations();
  std::vector<std::int32_t> away = AwayGaps(m);
  std::sort(away.begin(), away.end(), [&](std::int32_t x, std::int32_t y) {
    const std::size_t bx = allocs[m.gaps[x].allocation].movable_bytes();
    const std::size_t by = allocs[m.gaps[y].allocation].movable_bytes();
    return bx != by ? bx > by : x < y;
  });
  for (std::int32_t g : away) {
    Gap& gap = m.gaps[g];
    const std::int64_t b = static_cast<std::int64_t>(allocs[gap.allocation].movable_bytes());
    bool fits = true;
    ForPieces(m.n, gap.u + 1, gap.v,
              [&](Index l, Index r) { fits = fits && count.Max(l, r) + b <= capacity; });
    if (!fits) continue;
    gap.away = false;
    ForPieces(m.n, gap.u + 1, gap.v, [&](Index l, Index r) { count.Add(l, r, b); });
  }
}

// Pass 3: bring-backs ahead of use, the earliest use first, each to the
// event right after the last one in its window where it would not fit. A
// window that reaches into the step before serves a use later than this
// step's tail, whose own bring-backs it would otherwise crowd out.
void BringAhead(const Step& step, const ReplayPlanOptions& options, std::int64_t capacity, Model& m,
                MaxTree& count) {
  const auto& allocs = step.allocations();
  auto lowest = [&](const Gap& g) { return std::max(g.u + 2, g.v - options.max_lead_events); };
  auto urgency = [&](const Gap& g) { return lowest(g) < 0 ? g.v + m.n : g.v; };
  std::vector<std::int32_t> away = AwayGaps(m);
  std::sort(away.begin(), away.end(), [&](std::int32_t x, std::int32_t y) {
    const Index ux = urgency(m.gaps[x]), uy = urgency(m.gaps[y]);
    return ux != uy ? ux < uy : x < y;
  });
  constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max() / 4;
  const std::int64_t cap_in_flight =
      options.max_in_flight_bytes == 0
          ? kUnbounded
          : static_cast<std::int64_t>(
                std::min<std::size_t>(options.max_in_flight_bytes, kUnbounded));
  MaxTree in_flight(std::vector<std::int64_t>(m.n, 0));
  for (std::int32_t g : away) {
    Gap& gap = m.gaps[g];
    const std::int64_t b = static_cast<std::int64_t>(allocs[gap.allocation].movable_bytes());
    const Index lo = lowest(gap);
    auto last_blocked = [&](Index l, Index r) {
      return std::max(count.LastAbove(l, r, capacity - b),
                      in_flight.LastAbove(l, r, cap_in_flight - b));
    };
    // The piece nearer the use first: a slot blocked there decides.
    gap.bring = lo;
    if (lo < 0) {
      const Index p = gap.v > 0 ? last_blocked(0, gap.v) : -1;
      const Index q = p >= 0 ? -1 : last_blocked(lo + m.n, m.n);
      if (p >= 0) {
        gap.bring = p + 1;
      } else if (q >= 0) {
        gap.bring = q + 1 - m.n;
      }
    } else {
      const Index p = last_blocked(lo, gap.v);
      if (p >= 0) gap.bring = p + 1;
    }
    ForPieces(m.n, gap.bring, gap.v, [&](Index l, Index r) {
      count.Add(l, r, b);
      in_flight.Add(l, r, b);
    });
  }
}

// For the dirty walk: whether each away gap's send must write back.
void MarkWriteBacks(const Step& step, Model& m) {
  for (std::size_t a = 0; a < m.uses.size(); ++a) {
    const Step::Allocation& al = step.allocations()[a];
    const auto& uses = m.uses[a];
    const auto& gaps = m.gaps_of[a];
    if (uses.empty() || gaps.empty()) continue;
    // In time order: the uses, each followed by the gaps after it; a
    // persistent allocation's cycle is walked twice so that the second walk
    // starts from the state the cycle settles in. A carried allocation the
    // step frees starts written (the step before made it on the device).
    bool dirty = true;
    const int walks = al.persistent() ? 2 : 1;
    for (int w = 0; w < walks; ++w) {
      std::size_t g = 0;
      auto gaps_after = [&](int use) {
        for (; g < gaps.size() && m.gaps[gaps[g]].after_use == use; ++g) {
          Gap& gap = m.gaps[gaps[g]];
          if (!gap.away) continue;
          gap.write_back = dirty;
          dirty = false;  // brought back: the host's copy is valid again
        }
      };
      gaps_after(-1);
      for (std::size_t i = 0; i < uses.size(); ++i) {
        dirty = dirty || uses[i].writes;
        gaps_after(static_cast<int>(i));
      }
    }
  }
}

}  // namespace

std::size_t MinReplayDeviceBytes(const Step& step) {
  const Model m = BuildModel(step);
  const std::vector<std::int64_t> floor = Floor(m, step);
  std::int64_t most = 0;
  for (std::int64_t f : floor) most = std::max(most, f);
  return static_cast<std::size_t>(most);
}

absl::StatusOr<ReplayPlan> PlanReplay(const Step& step, const ReplayPlanOptions& options) {
  if (options.device_bytes == 0) {
    return absl::InvalidArgumentError("ReplayPlanOptions.device_bytes is 0: the step fits nowhere");
  }
  if (options.max_lead_events < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReplayPlanOptions.max_lead_events is %d; it must be at least 1", options.max_lead_events));
  }
  const auto& allocs = step.allocations();
  const std::int64_t capacity = static_cast<std::int64_t>(
      std::min<std::size_t>(options.device_bytes, std::numeric_limits<std::int64_t>::max() / 4));
  Model m = BuildModel(step);
  const std::vector<std::int64_t> floor = Floor(m, step);
  for (Index e = 0; e < m.n; ++e) {
    if (m.kernel[e] > capacity) {
      return absl::FailedPreconditionError(
          absl::StrFormat("the kernel at event %d needs %s at once; the device part is %s", e,
                          Bytes(m.kernel[e]), Bytes(capacity)));
    }
  }
  for (Index e = 0; e < m.n; ++e) {  // a kernel alone too large is named as such first
    if (floor[e] > capacity) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "at event %d, %s cannot leave the device (the kernel's %s, and allocations not yet "
          "used or no longer needed and not yet freed); the device part is %s",
          e, Bytes(floor[e]), Bytes(m.kernel[e]), Bytes(capacity)));
    }
  }
  // The sweep cuts the cycle where the fewest bytes could be away, so that
  // few of its choices cross the cut it cannot see across.
  Index start = 0;
  for (Index e = 1; e < m.n; ++e) {
    if (m.present[e] - floor[e] < m.present[start] - floor[start]) start = e;
  }
  absl::Status chosen = ChooseAway(step, capacity, start, m);
  if (!chosen.ok()) return chosen;

  MaxTree count = CountWithAway(step, m);
  KeepWhatFits(step, capacity, m, count);
  BringAhead(step, options, capacity, m, count);

  MarkWriteBacks(step, m);
  ReplayPlan plan;
  plan.host_for_good = m.host_for_good;
  for (const Gap& g : m.gaps) {
    if (!g.away) continue;
    const Step::Allocation& al = allocs[g.allocation];
    ReplayAction send;
    send.kind = ReplayAction::Kind::kSendAway;
    send.at_event = (g.u + 1 + m.n) % m.n;
    send.id = al.id;
    send.bytes = al.movable_bytes();
    send.write_back = g.write_back;
    plan.actions.push_back(send);
    ReplayAction bring;
    bring.kind = ReplayAction::Kind::kBringBack;
    bring.at_event = (g.bring + m.n) % m.n;
    bring.id = al.id;
    bring.bytes = al.movable_bytes();
    bring.lead_events = g.v - g.bring;
    plan.actions.push_back(bring);
    plan.bytes.h2d += al.movable_bytes();
    if (g.write_back) plan.bytes.d2h += al.movable_bytes();
  }
  std::sort(plan.actions.begin(), plan.actions.end(),
            [](const ReplayAction& x, const ReplayAction& y) {
              if (x.at_event != y.at_event) return x.at_event < y.at_event;
              if (x.kind != y.kind) return x.kind == ReplayAction::Kind::kSendAway;
              if (x.lead_events != y.lead_events) return x.lead_events < y.lead_events;
              return x.id < y.id;
            });
  plan.peak_device_bytes =
      m.n > 0 ? static_cast<std::size_t>(std::max<std::int64_t>(0, count.Max(0, m.n))) : 0;
  return plan;
}

}  // namespace cma
