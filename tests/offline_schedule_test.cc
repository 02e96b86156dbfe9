// policy/offline_schedule.h: the step's rules, hand-checked cases, and on
// random tiny steps an exhaustive search over every schedule:
// heuristic >= optimum >= lower bound, and the heuristic is the optimum when
// every allocation has one size and every use writes (Belady's case).
#include "policy/offline_schedule.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
constexpr auto kR = AccessMode::kRead;
constexpr auto kW = AccessMode::kWrite;
constexpr auto kRW = AccessMode::kReadWrite;

void Use(Step& s, std::vector<StepAccess> a) { ASSERT_TRUE(s.Use(a).ok()); }

// ---------------------------------------------------------------- the rules

TEST(StepTest, RejectsBrokenEventsAndKeepsTheStep) {
  Step s;
  ASSERT_TRUE(s.Live(1, 10).ok());
  ASSERT_TRUE(s.Alloc(2, 10).ok());
  EXPECT_THAT(s.Alloc(1, 5).message(), HasSubstr("id 1 is declared twice"));
  EXPECT_THAT(s.Live(2, 5).message(), HasSubstr("id 2 is declared twice"));
  EXPECT_THAT(s.Use({{3, kR}}).message(), HasSubstr("id 3 is used before it is declared"));
  EXPECT_THAT(s.Free(4).message(), HasSubstr("id 4 is freed before it is declared"));
  EXPECT_THAT(s.Use({}).message(), HasSubstr("names no allocation"));
  ASSERT_TRUE(s.Free(2).ok());
  EXPECT_THAT(s.Free(2).message(), HasSubstr("id 2 is freed twice"));
  // A use naming a good id and a freed one is rejected whole.
  EXPECT_THAT(s.Use({{1, kR}, {2, kR}}).message(), HasSubstr("id 2 is used after its free"));
  EXPECT_EQ(s.events().size(), 2u);  // alloc 2, free 2
  EXPECT_EQ(s.allocations()[0].first_use, -1);
  // One id named twice in a kernel is one access that writes.
  Use(s, {{1, kR}, {1, kW}});
  ASSERT_EQ(s.accesses().size(), 1u);
  EXPECT_TRUE(s.accesses()[0].writes);
}

// ---------------------------------------------------------------- by hand

TEST(OfflineScheduleTest, NothingMovesWhenTheStepFits) {
  Step s;
  ASSERT_TRUE(s.Live(1, 100).ok());  // a weight
  ASSERT_TRUE(s.Alloc(2, 50).ok());  // an activation
  Use(s, {{1, kR}, {2, kW}});
  Use(s, {{2, kR}, {1, kRW}});
  ASSERT_TRUE(s.Free(2).ok());
  const StepFacts f = MeasureStep(s, /*repeat=*/true);
  EXPECT_EQ(f.live_peak, 150u);
  EXPECT_EQ(f.working_peak, 150u);
  EXPECT_EQ(f.largest_use, 150u);
  ScheduleOptions o;
  o.device_bytes = 150;
  o.repeat = true;
  auto sched = PlanOfflineSchedule(s, o);
  ASSERT_TRUE(sched.ok()) << sched.status();
  EXPECT_TRUE(sched->steady);
  EXPECT_EQ(sched->h2d_per_step(), 0);
  EXPECT_EQ(sched->d2h_per_step(), 0);
  EXPECT_TRUE(sched->moves.empty());
  auto lb = LowerBoundLinkBytes(s, o);
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(lb->h2d, 0);
  EXPECT_EQ(lb->d2h, 0);
  // One step from a cold start fetches the weight once, and only that.
  o.repeat = false;
  sched = PlanOfflineSchedule(s, o);
  ASSERT_TRUE(sched.ok());
  EXPECT_EQ(sched->bytes.h2d, 100u);
  EXPECT_EQ(sched->bytes.d2h, 0u);
  lb = LowerBoundLinkBytes(s, o);
  EXPECT_EQ(lb->h2d, 100);
  EXPECT_EQ(lb->cold_h2d, 100);
}

TEST(OfflineScheduleTest, AKernelLargerThanTheDeviceIsAnError) {
  Step s;
  ASSERT_TRUE(s.Alloc(1, 60).ok());
  ASSERT_TRUE(s.Alloc(2, 60).ok());
  Use(s, {{1, kW}, {2, kW}});
  ScheduleOptions o;
  o.device_bytes = 100;
  EXPECT_THAT(PlanOfflineSchedule(s, o).status().message(),
              HasSubstr("the kernel at event 2 needs 120 bytes"));
  EXPECT_EQ(LowerBoundLinkBytes(s, o).status().code(), absl::StatusCode::kFailedPrecondition);
}

// Three weights of 10 used in turn, forward then backward, room for two:
// the classic case. A read-only weight leaves for nothing (its host copy is
// valid); one written comes back after a write-back.
TEST(OfflineScheduleTest, ReadOnlyDataLeavesForFree) {
  for (AccessMode mode : {kR, kRW}) {
    Step s;
    for (int w = 1; w <= 3; ++w) ASSERT_TRUE(s.Live(w, 10).ok());
    for (int w : {1, 2, 3, 3, 2, 1}) Use(s, {{static_cast<std::uint64_t>(w), mode}});
    ScheduleOptions o;
    o.device_bytes = 20;
    o.repeat = true;
    auto sched = PlanOfflineSchedule(s, o);
    ASSERT_TRUE(sched.ok());
    auto lb = LowerBoundLinkBytes(s, o);
    ASSERT_TRUE(lb.ok());
    // Steady state: weight 1 (used last and first) stays; 2 and 3 take
    // turns with one slot: each step fetches 3 before its first use and 2
    // before its second, or the equivalent.
    EXPECT_EQ(sched->h2d_per_step(), 20) << static_cast<int>(mode);
    EXPECT_EQ(sched->d2h_per_step(), mode == kR ? 0 : 20);
    EXPECT_LE(lb->h2d, sched->h2d_per_step());
    EXPECT_GT(lb->h2d, 0);
    EXPECT_EQ(lb->d2h, mode == kR ? 0 : lb->d2h);
    // Replaying the moves gives the bytes.
    std::uint64_t h2d = 0, d2h = 0;
    for (const ScheduleMove& m : sched->moves) {
      if (m.kind == ScheduleMove::Kind::kFetch) h2d += m.bytes;
      if (m.kind == ScheduleMove::Kind::kWriteBack) d2h += m.bytes;
    }
    EXPECT_EQ(h2d, sched->bytes.h2d);
    EXPECT_EQ(d2h, sched->bytes.d2h);
    EXPECT_LE(sched->peak_resident, o.device_bytes);
  }
}

TEST(OfflineScheduleTest, DataNotUsedAgainCostsNothing) {
  Step s;
  ASSERT_TRUE(s.Live(9, 40).ok());  // last step's gradient, freed unused
  for (int a = 1; a <= 4; ++a) {
    ASSERT_TRUE(s.Alloc(a, 30).ok());
    Use(s, {{static_cast<std::uint64_t>(a), kW}});
  }
  ASSERT_TRUE(s.Free(9).ok());
  ScheduleOptions o;
  o.device_bytes = 30;
  o.repeat = true;
  auto sched = PlanOfflineSchedule(s, o);
  ASSERT_TRUE(sched.ok());
  EXPECT_EQ(sched->bytes.h2d + sched->bytes.d2h, 0u);
  EXPECT_THAT(sched->never_resident, ::testing::ElementsAre(9u));
  EXPECT_EQ(MeasureStep(s, true).live_peak, 160u);
  EXPECT_EQ(MeasureStep(s, true).working_peak, 30u);
}

// ---------------------------------------------------------------- exhaustive search

// Every schedule of a dominant class: at each kernel, evict any subset of
// the resident data it does not use, then fetch (or create) what it uses.
// (Fetching earlier or evicting between kernels never saves a byte.) Units
// are allocations; a non-persistent allocation is a new unit in each copy.
class Exhaustive {
 public:
  Exhaustive(const Step& step, bool repeat, int copies, std::uint64_t capacity)
      : repeat_(repeat), capacity_(capacity) {
    const auto& allocs = step.allocations();
    std::vector<std::vector<int>> unit_of(allocs.size(), std::vector<int>(copies));
    for (std::size_t a = 0; a < allocs.size(); ++a) {
      for (int k = 0; k < copies; ++k) {
        if (k > 0 && repeat && allocs[a].persistent()) {
          unit_of[a][k] = unit_of[a][0];
          continue;
        }
        unit_of[a][k] = static_cast<int>(bytes_.size());
        bytes_.push_back(allocs[a].bytes);
        carried_.push_back(allocs[a].carried);
        persistent_.push_back(allocs[a].persistent());
      }
    }
    for (int k = 0; k < copies; ++k) {
      for (const Step::Event& e : step.events()) {
        if (e.kind == Step::Kind::kAlloc) continue;
        Ev ev;
        if (e.kind == Step::Kind::kFree) {
          ev.free_unit = unit_of[e.allocation][k];
        } else {
          for (std::int64_t i = e.access_begin; i < e.access_end; ++i) {
            const auto& acc = step.accesses()[i];
            ev.uses |= 1u << unit_of[acc.allocation][k];
            if (acc.writes) ev.writes |= 1u << unit_of[acc.allocation][k];
          }
        }
        events_.push_back(ev);
      }
    }
    // needed_after_[e]: units whose data is needed after event e.
    needed_after_.assign(events_.size(), 0);
    std::uint32_t later = 0;
    for (std::size_t u = 0; u < bytes_.size(); ++u) {
      if (persistent_[u]) later |= 1u << u;  // kept, or used in the next step
    }
    for (int e = static_cast<int>(events_.size()) - 1; e >= 0; --e) {
      needed_after_[e] = later;
      later |= events_[e].uses;
    }
  }

  // Least bytes moved, weighting H2D and D2H: one step alone from a cold
  // start, or (repeat) the best cycle over `copies` steps.
  double Min(int w_h2d, int w_d2h) {
    w_h2d_ = w_h2d;
    w_d2h_ = w_d2h;
    std::uint32_t carried = 0, persistent = 0;
    for (std::size_t u = 0; u < bytes_.size(); ++u) {
      if (carried_[u]) carried |= 1u << u;
      if (persistent_[u]) persistent |= 1u << u;
    }
    if (!repeat_) {
      memo_.clear();
      target_ = kAnyEnd;
      return Solve(0, 0, 0, carried);
    }
    double best = kInf;
    // Every start: a resident subset of the persistent units, a dirty subset of it.
    for (std::uint32_t r = persistent;; r = (r - 1) & persistent) {
      for (std::uint32_t d = r;; d = (d - 1) & r) {
        memo_.clear();
        target_ = (static_cast<std::uint64_t>(r) << 32) | d;
        best = std::min(best, Solve(0, r, d, carried));
        if (d == 0) break;
      }
      if (r == 0) break;
    }
    return best;
  }

 private:
  struct Ev {
    std::uint32_t uses = 0, writes = 0;
    int free_unit = -1;
  };
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  static constexpr std::uint64_t kAnyEnd = ~std::uint64_t{0};

  std::uint64_t Bytes(std::uint32_t mask) const {
    std::uint64_t b = 0;
    for (std::size_t u = 0; u < bytes_.size(); ++u) {
      if (mask & (1u << u)) b += bytes_[u];
    }
    return b;
  }

  double Solve(std::size_t e, std::uint32_t resident, std::uint32_t dirty, std::uint32_t data) {
    if (e == events_.size()) {
      if (target_ == kAnyEnd) return 0;
      std::uint32_t persistent = 0;
      for (std::size_t u = 0; u < bytes_.size(); ++u) {
        if (persistent_[u]) persistent |= 1u << u;
      }
      const std::uint64_t end = (static_cast<std::uint64_t>(resident & persistent) << 32) |
                                (dirty & resident & persistent);
      return end == target_ ? 0 : kInf;
    }
    const auto key = std::make_tuple(e, resident, dirty, data);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    const Ev& ev = events_[e];
    double best = kInf;
    if (ev.free_unit >= 0) {
      const std::uint32_t bit = 1u << ev.free_unit;
      best = Solve(e + 1, resident & ~bit, dirty & ~bit, data & ~bit);
    } else {
      const std::uint32_t evictable = resident & ~ev.uses;
      for (std::uint32_t out = evictable;; out = (out - 1) & evictable) {
        const std::uint32_t kept = resident & ~out;
        const std::uint32_t in = ev.uses & ~kept;
        if (Bytes(kept) + Bytes(in) <= capacity_) {
          const double d2h = static_cast<double>(Bytes(out & dirty & needed_after_[e]));
          const double h2d = static_cast<double>(Bytes(in & data));
          const std::uint32_t created = in & ~data;
          const double cost = w_h2d_ * h2d + w_d2h_ * d2h;
          best = std::min(best, cost + Solve(e + 1, kept | ev.uses,
                                             (dirty & kept) | ev.writes | created,
                                             data | ev.uses));
        }
        if (out == 0) break;
      }
    }
    memo_[key] = best;
    return best;
  }

  bool repeat_;
  std::uint64_t capacity_;
  std::vector<std::uint64_t> bytes_;
  std::vector<bool> carried_, persistent_;
  std::vector<Ev> events_;
  std::vector<std::uint32_t> needed_after_;
  int w_h2d_ = 1, w_d2h_ = 1;
  std::uint64_t target_ = kAnyEnd;
  absl::flat_hash_map<std::tuple<std::size_t, std::uint32_t, std::uint32_t, std::uint32_t>,
                      double>
      memo_;
};

// A random tiny step: persistent, carried-and-freed and made allocations,
// kernels of one or two allocations, frees after the last use.
Step RandomStep(std::mt19937& rng, int allocations, bool unit_sizes, bool all_rw) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  enum Type { kPersistent, kCarriedFreed, kMade };
  std::vector<Type> type(allocations);
  std::vector<std::uint64_t> bytes(allocations);
  for (int a = 0; a < allocations; ++a) {
    type[a] = static_cast<Type>(pick(0, 2));
    bytes[a] = unit_sizes ? 1 : pick(1, 4);
  }
  const int kernels = pick(3, 9);
  std::vector<std::vector<int>> uses(kernels);
  for (auto& k : uses) {
    k.push_back(pick(0, allocations - 1));
    if (pick(0, 2) == 0) {
      const int b = pick(0, allocations - 1);
      if (b != k[0]) k.push_back(b);
    }
  }
  std::vector<int> first(allocations, kernels), last(allocations, -1);
  for (int k = 0; k < kernels; ++k) {
    for (int a : uses[k]) {
      first[a] = std::min(first[a], k);
      last[a] = std::max(last[a], k);
    }
  }
  std::vector<int> free_after(allocations, -2);  // -2: never freed
  for (int a = 0; a < allocations; ++a) {
    if (type[a] == kPersistent) continue;
    if (type[a] == kMade && pick(0, 3) == 0) continue;  // live at the end
    free_after[a] = pick(std::max(last[a], -1), kernels - 1);
  }
  Step s;
  for (int a = 0; a < allocations; ++a) {
    if (type[a] != kMade) { EXPECT_TRUE(s.Live(a, bytes[a]).ok()); }
  }
  for (int a = 0; a < allocations; ++a) {
    if (type[a] == kMade && first[a] == kernels) { EXPECT_TRUE(s.Alloc(a, bytes[a]).ok()); }
  }
  for (int a = 0; a < allocations; ++a) {
    if (free_after[a] == -1) { EXPECT_TRUE(s.Free(a).ok()); }
  }
  const AccessMode modes[] = {kR, kW, kRW};
  for (int k = 0; k < kernels; ++k) {
    std::vector<StepAccess> acc;
    for (int a : uses[k]) {
      if (type[a] == kMade && first[a] == k) { EXPECT_TRUE(s.Alloc(a, bytes[a]).ok()); }
      acc.push_back({static_cast<std::uint64_t>(a), all_rw ? kRW : modes[pick(0, 2)]});
    }
    EXPECT_TRUE(s.Use(acc).ok());
    for (int a = 0; a < allocations; ++a) {
      if (free_after[a] == k) { EXPECT_TRUE(s.Free(a).ok()); }
    }
  }
  return s;
}

struct Checked {
  int cases = 0, tight = 0, at_optimum = 0;
};

void CheckAgainstExhaustive(std::mt19937& rng, bool repeat, bool unit_sizes, bool all_rw,
                            int allocations, Checked* stats) {
  const Step s = RandomStep(rng, allocations, unit_sizes, all_rw);
  const StepFacts f = MeasureStep(s, repeat);
  if (f.uses == 0) return;
  const std::uint64_t capacity = std::uniform_int_distribution<std::uint64_t>(
      f.largest_use, std::max(f.largest_use, f.working_peak))(rng);
  ScheduleOptions o;
  o.device_bytes = capacity;
  o.repeat = repeat;
  auto sched = PlanOfflineSchedule(s, o);
  auto lb = LowerBoundLinkBytes(s, o);
  ASSERT_TRUE(sched.ok()) << sched.status();
  ASSERT_TRUE(lb.ok()) << lb.status();
  ASSERT_LE(sched->peak_resident, capacity);
  ++stats->cases;
  const double h = sched->h2d_per_step(), d = sched->d2h_per_step();
  EXPECT_LE(lb->h2d, h + 1e-9);
  EXPECT_LE(lb->d2h, d + 1e-9);
  // Whatever the cycle, no periodic schedule beats the bound.
  for (int copies : repeat ? std::vector<int>{1, 2} : std::vector<int>{1}) {
    Exhaustive ex(s, repeat, copies, capacity);
    const double min_h2d = ex.Min(1, 0) / copies, min_d2h = ex.Min(0, 1) / copies;
    const double min_total = ex.Min(1, 1) / copies;
    SCOPED_TRACE(::testing::Message() << "capacity " << capacity << " copies " << copies
                                      << " heuristic " << h << "/" << d << " bound "
                                      << lb->h2d << "/" << lb->d2h << " optimum " << min_h2d
                                      << "/" << min_d2h << " total " << min_total);
    ASSERT_LT(min_total, std::numeric_limits<double>::infinity());
    EXPECT_LE(lb->h2d, min_h2d + 1e-9);
    EXPECT_LE(lb->d2h, min_d2h + 1e-9);
    if (!repeat) {
      EXPECT_GE(h + d, min_total);
      if (h + d == min_total) ++stats->at_optimum;
      if (lb->h2d == min_h2d && lb->d2h == min_d2h) ++stats->tight;
      if (unit_sizes && all_rw) {
        EXPECT_EQ(h, min_h2d);
        EXPECT_EQ(d, min_d2h);
      }
    }
  }
}

TEST(OfflineScheduleExhaustiveTest, OneStepVariableSizes) {
  std::mt19937 rng(48);
  Checked stats;
  for (int i = 0; i < 400 && !HasFatalFailure(); ++i) {
    CheckAgainstExhaustive(rng, false, false, false, 2 + i % 5, &stats);
  }
  // How close: printed, not asserted beyond the inequalities.
  std::printf("one step, variable sizes: %d cases, heuristic optimal in %d, bound tight in %d\n",
              stats.cases, stats.at_optimum, stats.tight);
}

TEST(OfflineScheduleExhaustiveTest, UnitSizesEveryUseWritesIsBelady) {
  std::mt19937 rng(1966);
  Checked stats;
  for (int i = 0; i < 400 && !HasFatalFailure(); ++i) {
    CheckAgainstExhaustive(rng, false, true, true, 2 + i % 6, &stats);
  }
  EXPECT_EQ(stats.at_optimum, stats.cases);
}

TEST(OfflineScheduleExhaustiveTest, RepeatingStepBoundBelowEveryCycle) {
  std::mt19937 rng(7);
  Checked stats;
  for (int i = 0; i < 200 && !HasFatalFailure(); ++i) {
    CheckAgainstExhaustive(rng, true, i % 3 == 0, i % 2 == 0, 2 + i % 3, &stats);
  }
}

}  // namespace
}  // namespace cma
