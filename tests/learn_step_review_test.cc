// Reproducers from the adversarial review of the learned step's accounting
// (session 3 of 2026-11-29): what the host tier holds for good, a routing
// that changes between steps, and the pages a send leaves behind, on the
// host backend. Each failed on the core it was found in.
#include <cstring>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

// learn_step_test's fixture: eight 12 MiB parameters in a 160 MiB device
// part, eight 12 MiB activations a step.
class LearnReviewTest : public AllocatorTest {
 protected:
  static constexpr int kLayers = 8;
  static constexpr std::size_t kParam = 12 * kMiB;
  static constexpr std::size_t kAct = 12 * kMiB;

  void SetUp() override {
    Make({.device_count = 1, .device_capacity = 256 * kMiB},
         "oversubscribe:1,learn_step:1,managed_budget:1G,device_headroom:96M");
    s_ = *backend_->CreateStream(0);
    for (int i = 0; i < kLayers; ++i) params_.push_back(Alloc(kParam, 0, s_));
    ASSERT_TRUE(alloc_->MarkIteration(0).ok());
  }
  void TearDown() override {
    for (void* p : params_) EXPECT_TRUE(alloc_->Free(p).ok());
    AllocatorTest::TearDown();
  }
  void Use(std::vector<void*> ptrs) { ASSERT_TRUE(alloc_->NoteUses(0, ptrs, s_).ok()); }

  Stream s_ = 0;
  std::vector<void*> params_;
};

// Review: a carried allocation that the host tier took because the device
// was full (not routed) never lands on the device (it is never made again
// and a host-tier block cannot be brought back), yet the plan counts it at
// its size: an optimizer-style group use of it with the parameters then
// exceeds the planned part and the plan is refused for good.
TEST_F(LearnReviewTest, ReviewCarriedOverflowOnTheHostDoesNotBlockThePlan) {
  void* x = Alloc(72 * kMiB, 0, s_);  // the device holds the parameters: overflow
  ASSERT_TRUE(*alloc_->PlacedOnHost(x));
  std::vector<void*> group(params_.begin(), params_.end());
  group.push_back(x);
  auto step = [&] {
    int on_host = 0;
    std::vector<void*> acts;
    for (int i = 0; i < kLayers; ++i) {
      void* a = Alloc(kAct, 0, s_);
      on_host += *alloc_->PlacedOnHost(a);
      Use(i == 0 ? std::vector<void*>{params_[i], a}
                 : std::vector<void*>{params_[i], a, acts.back()});
      acts.push_back(a);
    }
    for (int i = kLayers - 1; i >= 0; --i) {
      Use({params_[i], acts[i]});
      EXPECT_TRUE(alloc_->Free(acts[i]).ok());
    }
    Use(group);
    EXPECT_TRUE(alloc_->MarkIteration(0).ok());
    ExpectInvariants();
    return on_host;
  };
  EXPECT_GT(step(), 0);
  int last = 0;
  for (int i = 0; i < 5; ++i) last = step();
  EXPECT_TRUE(*alloc_->PlacedOnHost(x)) << "a carried host-tier block stays there";
  EXPECT_GE(Stats().learned_plans, 1) << "the plan was refused";
  EXPECT_EQ(last, 0) << "activations still go to the host tier every step";
  EXPECT_TRUE(alloc_->Free(x).ok());
}

// Review: the plan stands while the sizes repeat, even when an allocation
// that the recording step routed to the host (0 device bytes in the plan)
// is made on the device in later steps: the plan never makes room for it.
TEST_F(LearnReviewTest, ReviewRoutingThatChangesIsLearntAgain) {
  auto step = [&](bool routed) {
    int on_host = 0;
    std::vector<void*> acts;
    for (int i = 0; i < kLayers; ++i) {
      if (routed) EXPECT_TRUE(alloc_->SetHostRouting(0, true).ok());
      void* a = Alloc(kAct, 0, s_);
      if (routed) EXPECT_TRUE(alloc_->SetHostRouting(0, false).ok());
      on_host += *alloc_->PlacedOnHost(a);
      Use(i == 0 ? std::vector<void*>{params_[i], a}
                 : std::vector<void*>{params_[i], a, acts.back()});
      acts.push_back(a);
    }
    for (int i = kLayers - 1; i >= 0; --i) {
      Use({params_[i], acts[i]});
      EXPECT_TRUE(alloc_->Free(acts[i]).ok());
    }
    EXPECT_TRUE(alloc_->MarkIteration(0).ok());
    return on_host;
  };
  step(true);
  step(true);  // a plan with every activation at 0 bytes: nothing moves
  const std::int64_t plans = Stats().learned_plans;
  step(false);
  step(false);  // recorded without routing: learnt again
  const DeviceStats before = Stats();
  int last = 0;
  for (int i = 0; i < 3; ++i) last = step(false);
  const DeviceStats after = Stats();
  EXPECT_GT(after.learned_plans, plans) << "the step's placement changed";
  EXPECT_EQ(last, 0) << "activations spill to the host tier under a stale plan";
  EXPECT_LT(after.host_overflow_bytes - before.host_overflow_bytes, 3 * kAct);
}


// Review: the plan counted a sent allocation's whole size as freed, but only
// the pages strictly inside it leave (away.cc InnerPages); with budget/16
// as the only room for that, a plan of many mid-sized allocations overran
// the part: bring-backs missed and allocations spilled to the host. Now
// each allocation's movable bytes reach the plan (LearnedSchedule::Extent).
class LearnMarginTest : public AllocatorTest,
                        public ::testing::WithParamInterface<std::tuple<int, int, int>> {};

TEST_P(LearnMarginTest, ReviewSteadyStepHasNoMissNorSpill) {
  const auto [layers, param_k, act_k] = GetParam();
  const std::size_t param = param_k * std::size_t{1024} * 1024 / 4;
  const std::size_t act = act_k * std::size_t{1024} * 1024 / 4;
  Make({.device_count = 1, .device_capacity = 256 * kMiB},
       "oversubscribe:1,learn_step:1,managed_budget:1G,device_headroom:96M");
  Stream s = *backend_->CreateStream(0);
  std::vector<void*> params;
  for (int i = 0; i < layers; ++i) params.push_back(Alloc(param, 0, s));
  ASSERT_TRUE(alloc_->MarkIteration(0).ok());
  auto use = [&](std::vector<void*> p) { ASSERT_TRUE(alloc_->NoteUses(0, p, s).ok()); };
  auto step = [&] {
    const DeviceStats before = Stats();
    std::vector<void*> acts;
    for (int i = 0; i < layers; ++i) {
      void* a = Alloc(act, 0, s);
      use(i == 0 ? std::vector<void*>{params[i], a}
                 : std::vector<void*>{params[i], a, acts.back()});
      acts.push_back(a);
    }
    for (int i = layers - 1; i >= 0; --i) {
      use({params[i], acts[i]});
      EXPECT_TRUE(alloc_->Free(acts[i]).ok());
    }
    EXPECT_TRUE(alloc_->MarkIteration(0).ok());
    const DeviceStats now = Stats();
    return std::pair<std::int64_t, std::int64_t>(
        now.learned_misses - before.learned_misses,
        now.host_overflow_bytes - before.host_overflow_bytes);
  };
  for (int i = 0; i < 4; ++i) step();
  std::int64_t misses = 0, spilled = 0;
  for (int i = 0; i < 3; ++i) {
    auto [m, h] = step();
    misses += m;
    spilled += h;
  }
  EXPECT_GE(Stats().learned_plans, 1);
  EXPECT_EQ(misses, 0);
  EXPECT_EQ(spilled, 0);
  ASSERT_TRUE(backend_->SynchronizeStream(s).ok());
  for (void* p : params) EXPECT_TRUE(alloc_->Free(p).ok());
}

// (12 layers of 10 MiB parameters and 10 MiB activations still misses
// about seven bring-backs a step with the device's pages all in use, at any
// margin: a send the plan places at an allocation event is issued at the
// next reported use, the clock the replay keeps. Open, stated in
// docs/oversubscription.md.)
INSTANTIATE_TEST_SUITE_P(Sizes, LearnMarginTest, ::testing::Values(std::make_tuple(12, 20, 40)));

}  // namespace
}  // namespace cma
