// The fence between a Sleep's discards and the next population
// (allocator/discard_fence.h): a host function on a stream of its own behind
// the discards, and the populating stream waits for it on the device; off,
// absent without discards, best effort when the backend fails.
#include "allocator/discard_fence.h"

#include <cstring>
#include <vector>

#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class DiscardFenceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    fence_.Release(b_);
    for (Stream s : {s_, t_}) (void)b_.DestroyStream(s);
    EXPECT_EQ(b_.LiveResources().events, 0);
  }
  HostBackend b_{{.manual_completion = true}};
  Stream s_ = *b_.CreateStream(0), t_ = *b_.CreateStream(0);
  DiscardFence fence_{true};
};

TEST_F(DiscardFenceTest, ThePopulatingStreamWaitsForTheWorkBehindTheDiscards) {
  fence_.Order(b_, t_, true);
  EXPECT_EQ(b_.CallCount("LaunchHostFunction"), 0) << "nothing marked: no fence";
  ASSERT_TRUE(b_.EnqueueWork(s_).ok());  // the discards, still running
  fence_.Mark(b_, 0, s_);
  EXPECT_EQ(b_.CallCount("LaunchHostFunction"), 1);
  fence_.Order(b_, t_, /*end_cycle=*/false);
  // What t_ queues next (the population) waits for the discards and then
  // for the host function behind them.
  EXPECT_FALSE(*b_.QueryStream(t_)) << "t_ would populate before the discards' work was done";
  ASSERT_TRUE(b_.CompleteWork(s_).ok());
  EXPECT_TRUE(*b_.QueryStream(t_));
  EXPECT_EQ(fence_.fenced(), 1);
  // Until the cycle's end, later populations are fenced too; then none.
  fence_.Order(b_, t_, /*end_cycle=*/true);
  fence_.Order(b_, t_, /*end_cycle=*/true);
  EXPECT_EQ(fence_.fenced(), 2);
  EXPECT_EQ(b_.CallCount("CreateStream"), 2 + 1) << "one stream of its own, made once";
}

TEST(DiscardFenceOffTest, OffMakesNoCalls) {
  HostBackend b;
  DiscardFence fence(false);
  fence.Mark(b, 0, kDefaultStream);
  fence.Order(b, kDefaultStream, true);
  fence.Release(b);
  EXPECT_EQ(b.CallCount("LaunchHostFunction"), 0);
  EXPECT_EQ(b.CallCount("CreateStream"), 0);
  EXPECT_EQ(fence.fenced(), 0);
}

// A backend whose streams, events or host functions fail gets no fence and
// no error (only speed is at stake), and nothing leaks.
TEST(DiscardFenceFallbackTest, FailingCallsMeanNoFence) {
  for (const FaultKind kind : {FaultKind::kEventCreate, FaultKind::kEventRecord, FaultKind::kOther}) {
    SCOPED_TRACE(FaultKindName(kind));
    HostBackend inner({.manual_completion = true});
    FaultInjectingBackend b(inner);
    Stream s = *inner.CreateStream(0);
    DiscardFence fence(true);
    b.SetPlan({.kind = kind, .probability = 1.0});
    fence.Mark(b, 0, s);
    fence.Order(b, s, true);
    EXPECT_EQ(fence.fenced(), 0);
    fence.Release(b);
    EXPECT_EQ(inner.LiveResources().events, 0);
    ASSERT_TRUE(inner.DestroyStream(s).ok());
  }
}

class WakeFenceTest : public AllocatorTest {
 protected:
  void Remake(const std::string& config) {
    Make({.device_count = 1, .device_capacity = std::size_t{1} << 30, .manual_completion = true},
         config);
    s1_ = *backend_->CreateStream(0);
  }
  void TearDown() override {
    AllocatorTest::TearDown();
    if (backend_) backend_->DestroyStream(s1_).IgnoreError();
  }
  Stream s1_ = 0;
};

TEST_F(WakeFenceTest, AWakeAndAMoveWhileAsleepAreFenced) {
  Remake("");
  void* a = Alloc(4 * kMiB, 0, s1_);
  void* b = Alloc(4 * kMiB, 0, s1_);
  std::memset(a, 3, 4 * kMiB);
  std::memset(b, 4, 4 * kMiB);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_EQ(backend_->CallCount("LaunchHostFunction"), 1);
  ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s1_).ok());
  EXPECT_EQ(Stats().num_wake_fences, 1);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(Stats().num_wake_fences, 2);
  EXPECT_EQ(static_cast<unsigned char*>(a)[4 * kMiB - 1], 3);
  EXPECT_EQ(static_cast<unsigned char*>(b)[4 * kMiB - 1], 4);
  // A refused wake changes nothing (the count included).
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  const std::string before = Fingerprint(*alloc_);
  EXPECT_FALSE(alloc_->Wake(0, Stream{0xbad}).ok());
  EXPECT_EQ(Fingerprint(*alloc_), before);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(Stats().num_wake_fences, 3);
  ASSERT_TRUE(alloc_->ResetAccumulatedStats(0).ok());
  EXPECT_EQ(Stats().num_wake_fences, 0);
  for (void* p : {a, b}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(WakeFenceTest, OffMeansNoFence) {
  Remake("wake_fence:0");
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(backend_->CallCount("LaunchHostFunction"), 0);
  EXPECT_EQ(Stats().num_wake_fences, 0);
  ASSERT_TRUE(alloc_->Free(a).ok());
}

}  // namespace
}  // namespace cma
