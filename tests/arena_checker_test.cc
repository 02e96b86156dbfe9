// The randomized differential checker (tests/arena_checker.h) with fixed
// seeds over the allocator's configurations. CMA_CHECKER_STEPS overrides the
// steps per run (default 2500); a failure prints the recent steps.
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/arena_checker.h"

namespace cma {
namespace {

int StepsPerRun() {
  const char* env = std::getenv("CMA_CHECKER_STEPS");
  return env != nullptr ? std::atoi(env) : 2500;
}

struct Case {
  const char* name;
  const char* config;
};

class ArenaCheckerTest : public ::testing::TestWithParam<Case> {};

void RunSeeds(const Case& c, bool pool_checkpoints, bool away_steps = false, int busy = 0) {
  // (Busy streams make every step dearer: one seed, half the steps there.)
  for (std::uint64_t seed : busy == 0 ? std::vector<std::uint64_t>{1, 2, 3}
                                      : std::vector<std::uint64_t>{1}) {
    auto checker = ArenaChecker::Create(c.config, std::size_t{256} << 20, pool_checkpoints,
                                        away_steps, busy);
    ASSERT_TRUE(checker.ok()) << checker.status();
    SeededSource in(seed * 7919 + std::hash<std::string>()(c.name));
    const int steps = busy == 0 ? StepsPerRun() : StepsPerRun() / 2;
    for (int i = 0; i < steps; ++i) {
      absl::Status s = (*checker)->Step(in);
      ASSERT_TRUE(s.ok()) << "config '" << c.config << "' seed " << seed << "\n" << s.message();
    }
    absl::Status s = (*checker)->Finish();
    ASSERT_TRUE(s.ok()) << "config '" << c.config << "' seed " << seed << "\n" << s.message();
  }
}

TEST_P(ArenaCheckerTest, FindsNothingOverFixedSeeds) { RunSeeds(GetParam(), false); }

// Streams that often answer "busy" although their work is done (a GPU's):
// free blocks cross streams by the idle marks (AdoptIdleStreams), which the
// checker's rule (nothing reused before its last use completed) must hold.
TEST_P(ArenaCheckerTest, FindsNothingWhenStreamsOftenAnswerBusy) {
  RunSeeds(GetParam(), false, false, /*busy=*/50);
}

// Also taking and restoring pools' checkpoints (torch.compile's cudagraph trees).
TEST_P(ArenaCheckerTest, FindsNothingWithPoolCheckpoints) { RunSeeds(GetParam(), true); }

// Also sending live allocations away and bringing them back (issue 48).
TEST_P(ArenaCheckerTest, FindsNothingWithAwaySteps) { RunSeeds(GetParam(), false, true); }

// Raw seeds outside the fixed ones that once found a bug, with the
// configuration and checkpoints they found it under.
struct Regression {
  const char* config;
  std::uint64_t seed;
  bool pool_checkpoints;
  const char* bug;
  bool away_steps = false;
};

TEST(ArenaCheckerRegressionTest, SeedsThatFoundBugsFindNothing) {
  static constexpr Regression kSeeds[] = {
      // Issue 34, item 3: a classic segment's discard_on_free left its page
      // among the Sleep's edge pages, which the Wake then populated on its
      // own stream ahead of the discard.
      {"segments:classic,discard_on_free:1", 5018, true, "discard_on_free edge page"},
      {"segments:classic,discard_on_free:1", 3607321673402834886u, true, "discard_on_free edge page"},
      {"segments:classic,discard_on_free:1", 3607321673403040780u, true, "discard_on_free edge page"},
      // A Move to the host of a block a Sleep staged brought back only the
      // copy, yet the free counted the rounding's discarded pages populated.
      {"roundup_power2_divisions:4", 5715716591337748030u, true, "staged tail moved to host"},
      // The checker's model: a restore under a use_mem_pool context queued
      // waits on the freed blocks' streams, which it took for their uses.
      {"garbage_collection_threshold:0.5,arena_size:32M", 18357064564371240651u, true,
       "restore's own waits counted as uses", true},
  };
  for (const Regression& r : kSeeds) {
    auto checker =
        ArenaChecker::Create(r.config, std::size_t{256} << 20, r.pool_checkpoints, r.away_steps);
    ASSERT_TRUE(checker.ok()) << checker.status();
    SeededSource in(r.seed);
    absl::Status s;
    for (int i = 0; i < StepsPerRun() && s.ok(); ++i) s = (*checker)->Step(in);
    if (s.ok()) s = (*checker)->Finish();
    EXPECT_TRUE(s.ok()) << r.bug << ": config '" << r.config << "' raw seed " << r.seed << "\n"
                        << s.message();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ArenaCheckerTest,
    ::testing::Values(Case{"default", ""}, Case{"slack", "idle_page_slack:0.1"},
                      Case{"strict", "idle_page_slack:0"},
                      Case{"discard_on_free", "discard_on_free:1"},
                      Case{"release_threshold", "release_threshold:16M"},
                      Case{"staging_bound", "sleep_staging_max:24M"},
                      Case{"migrate_only", "sleep_staging_max:0"},
                      Case{"small_arenas", "arena_size:16M"},
                      Case{"gc", "garbage_collection_threshold:0.5,arena_size:32M"},
                      Case{"power2", "roundup_power2_divisions:4"},
                      Case{"no_prefetch", "prefetch:none"},
                      Case{"classic", "segments:classic"},
                      Case{"classic_discard", "segments:classic,discard_on_free:1"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cma
