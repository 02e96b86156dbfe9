// The learned step (config learn_step:1, allocator/learned_schedule.h) on
// the host backend: a layer-by-layer training step larger than the device's
// part is recorded, planned and replayed; what did not fit lands on the
// device once the plan sends what waits away; the data survives; a step
// that changes is learnt again; and LearnedSchedule's own bookkeeping.
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "tests/learn_step_fixture.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
constexpr std::size_t kMiB = std::size_t{1} << 20;

class LearnStepTest : public LearnStepFixture {
 protected:
  static constexpr int kLayers = 8;
  static constexpr std::size_t kParam = 12 * kMiB;
  static constexpr std::size_t kAct = 12 * kMiB;

  void SetUp() override { MakeLayers(kLayers, kParam); }
  int Step(int layers = kLayers) { return RunStep({.layers = layers, .act = kAct}); }
};

TEST_F(LearnStepTest, ALearnedStepFitsTheDeviceWhereTheFirstDidNot) {
  const int first = Step();
  EXPECT_GT(first, 0) << "the step is larger than the device's part";
  int last = first;
  for (int i = 0; i < 5; ++i) last = Step();
  const DeviceStats st = Stats();
  EXPECT_GE(st.learned_plans, 1);
  EXPECT_GE(st.learned_steps, 6);
  EXPECT_EQ(last, 0) << "the plan sends what waits away: every activation on the device";
  EXPECT_GT(st.sent_away_bytes, 0);
  EXPECT_GT(st.brought_back_bytes, 0);
  EXPECT_LE(st.reserved_bytes[kAllPools].peak, static_cast<std::int64_t>(160 * kMiB));
  // A plan that repeats is kept, not made again every step.
  const std::int64_t plans = st.learned_plans;
  Step();
  Step();
  EXPECT_EQ(Stats().learned_plans, plans);
  ExpectParamsIntact();  // the data went away and came back
}

TEST_F(LearnStepTest, NothingIsDiscardedWhileTheStepIsLearnt) {
  // On the H200 a discard beside the learned step's transfers changed a
  // training's losses, and the same run without discards did not: with
  // learn_step:1 dead contents stay where they are (the driver evicts them
  // by need), while the accounting still counts their pages free.
  for (int i = 0; i < 6; ++i) Step();
  const DeviceStats st = Stats();
  ASSERT_GT(st.sent_away_bytes, 0);
  EXPECT_GT(st.num_pages_discarded, 0) << "the steps made room by idle pages";
  EXPECT_EQ(backend_->CallCount("DiscardBatch"), 0);
  EXPECT_EQ(backend_->CallCount("DiscardAndPrefetchBatch"), 0);
  // Said as it is: no discard call counted, the pages kept counted apart.
  EXPECT_EQ(st.discard_calls, 0);
  EXPECT_GE(st.kept_dead_bytes, st.num_pages_discarded * static_cast<std::int64_t>(2 << 20));
  ExpectParamsIntact();
}

TEST_F(LearnStepTest, EmptyCacheStillGivesTheMemoryBack) {
  // What the user asks to be given back is discarded also while the step is
  // learnt (else the driver would hold pages the statistics call free), and
  // the streams wait for a host function behind the discards.
  for (int i = 0; i < 4; ++i) Step();
  ASSERT_GT(Stats().idle_populated_bytes, 0);
  const std::int64_t host_functions = backend_->CallCount("LaunchHostFunction");
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_GT(backend_->CallCount("DiscardBatch"), 0);
  EXPECT_GT(backend_->CallCount("LaunchHostFunction"), host_functions);
  EXPECT_EQ(Stats().idle_populated_bytes, 0);
  MemInfo m = *backend_->GetMemInfo(0);
  EXPECT_EQ(static_cast<std::int64_t>(m.total_bytes - m.free_bytes),
            Stats().reserved_bytes[kAllPools].current)
      << "the backend holds what the statistics count, no more";
  Step();  // the step goes on, learnt as before
  EXPECT_EQ(Stats().num_placement_errors, 0);
  ExpectParamsIntact();
}

TEST_F(LearnStepTest, WhatTheHostTierTookLandsOnTheDeviceAndThePlanStands) {
  // Oversubscription's optimizer state, routed to the host for good and
  // used by the step's last kernel: it counts nothing on the device, so the
  // plan makes no room for it. What the first step placed on the host
  // because the device was full counts at its size: once the plan makes
  // room, every activation lands on the device, step after step, under one
  // plan, and nothing stays away between steps that was not away before.
  std::vector<void*> state;
  ASSERT_TRUE(alloc_->SetHostRouting(0, true).ok());
  for (int i = 0; i < kLayers; ++i) state.push_back(Alloc(2 * kParam, 0, s_));
  ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
  for (void* p : state) {
    ASSERT_TRUE(*alloc_->PlacedOnHost(p));
    std::memset(p, 's', 2 * kParam);
  }
  std::vector<void*> optimizer(params_.begin(), params_.end());
  optimizer.insert(optimizer.end(), state.begin(), state.end());
  auto step = [&] { return RunStep({.act = kAct, .last_use = optimizer}); };
  EXPECT_GT(step(), 0) << "the first step is larger than the device's part";
  for (int i = 0; i < 2; ++i) step();
  const DeviceStats before = Stats();
  EXPECT_GE(before.learned_plans, 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(step(), 0) << "step " << i + 4;
  const DeviceStats st = Stats();
  EXPECT_EQ(st.learned_plans, before.learned_plans) << "the plan stands";
  EXPECT_EQ(st.away_bytes[kAllPools].current, before.away_bytes[kAllPools].current)
      << "nothing left away drifts";
  EXPECT_EQ(st.learned_misses, before.learned_misses);
  ASSERT_TRUE(backend_->SynchronizeStream(s_).ok());
  for (void* p : state) {
    EXPECT_EQ(static_cast<const char*>(p)[kParam], 's');
    EXPECT_TRUE(alloc_->Free(p).ok());
  }
}

TEST_F(LearnStepTest, AStepThatChangesIsLearntAgain) {
  for (int i = 0; i < 4; ++i) Step();
  const DeviceStats before = Stats();
  Step(/*layers=*/5);  // another shape: the replay stops at the first difference
  Step(5);
  EXPECT_GT(Stats().learned_divergences, before.learned_divergences);
  EXPECT_GT(Stats().learned_plans, before.learned_plans);
  EXPECT_EQ(Step(5), 0);
}

TEST_F(LearnStepTest, UsesAreRefusedWithoutTheModeAndCheckTheirArguments) {
  EXPECT_EQ(alloc_->NoteUses(3, {}, s_).code(), absl::StatusCode::kInvalidArgument);
  void* p = params_[0];
  EXPECT_EQ(alloc_->NoteUses(0, {&p, 1}, Stream{0xbad}).code(),
            absl::StatusCode::kInvalidArgument);
  int local = 0;
  void* foreign = &local;
  EXPECT_TRUE(alloc_->NoteUses(0, {&foreign, 1}, s_).ok()) << "memory it does not track: ignored";
}

TEST(LearnStepOffTest, NoteUsesNeedsTheMode) {
  HostBackend backend({.device_count = 1});
  auto a = CachingManagedAllocator::Create(backend, "");
  ASSERT_TRUE(a.ok());
  auto p = (*a)->Allocate(kMiB, 0);
  ASSERT_TRUE(p.ok());
  absl::Status s = (*a)->NoteUses(0, {&*p, 1}, kDefaultStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("learn_step:1"));
  ASSERT_TRUE((*a)->Free(*p).ok());
}

TEST(LearnedScheduleTest, ReplaysWhileTheUsesMatchAndStopsAtTheFirstDifference) {
  // Two carried allocations used at the step's two ends: with room for one,
  // the plan sends one away and brings it back.
  LearnedSchedule ls;
  LearnedSchedule::Due due;
  const std::pair<std::uintptr_t, LearnedSchedule::Extent> live[] = {
      {0x1000000, {8 * kMiB, 8 * kMiB}}, {0x2000000, {8 * kMiB, 8 * kMiB}}};
  ReplayPlanOptions options;
  options.device_bytes = 12 * kMiB;
  options.max_lead_events = 4;
  auto one_step = [&](std::size_t middle_bytes, std::vector<std::uintptr_t>* sent,
                      std::vector<std::uintptr_t>* brought, std::size_t first_reported = 1) {
    auto take = [&] {
      sent->insert(sent->end(), due.send.begin(), due.send.end());
      brought->insert(brought->end(), due.bring.begin(), due.bring.end());
    };
    const std::uintptr_t first[] = {0x1000000}, middle[] = {0x3000000}, last[] = {0x2000000};
    ls.Use(first, first_reported, &due);
    take();
    ls.Alloc(middle_bytes, &due);
    take();
    ls.AllocDone(0x3000000, {middle_bytes, middle_bytes});
    ls.Use(middle, 1, &due);
    take();
    ls.Free(0x3000000, &due);
    take();
    ls.Use(last, 1, &due);
    take();
    ASSERT_TRUE(ls.EndStep(options, &due).ok());
    take();
    ls.BeginStep(live);
  };
  ls.BeginStep(live);
  std::vector<std::uintptr_t> sent, brought;
  one_step(2 * kMiB, &sent, &brought);
  EXPECT_TRUE(ls.has_plan());
  EXPECT_TRUE(sent.empty() && brought.empty()) << "the first step only records";
  sent.clear();
  one_step(2 * kMiB, &sent, &brought);
  EXPECT_FALSE(sent.empty());
  EXPECT_FALSE(brought.empty());
  EXPECT_EQ(ls.counts().plans, 1);
  EXPECT_EQ(ls.counts().divergences, 0);
  sent.clear();
  brought.clear();
  one_step(4 * kMiB, &sent, &brought);  // another size: replayed, then planned anew
  EXPECT_EQ(ls.counts().divergences, 0);
  EXPECT_EQ(ls.counts().plans, 2) << "its allocations differ: it plans the next";
  EXPECT_FALSE(sent.empty()) << "the carried allocations' actions still apply";
  one_step(4 * kMiB, &sent, &brought);
  EXPECT_EQ(ls.counts().plans, 2) << "a step that repeats keeps the plan";
  one_step(4 * kMiB, &sent, &brought, /*first_reported=*/3);  // the model changed
  EXPECT_EQ(ls.counts().divergences, 1);
  EXPECT_EQ(ls.counts().plans, 3) << "the differing step plans the next";
}

}  // namespace
}  // namespace cma
