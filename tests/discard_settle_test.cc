// The pause between a Sleep's discards and a Wake's population
// (allocator/discard_settle.h): on the caller's thread for what is left of
// the settle time once the discards have completed, in stream order when
// they have not, counted, and absent when off or when nothing was
// discarded.
#include "allocator/discard_settle.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMiB = std::size_t{1} << 20;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

class DiscardSettleTest : public ::testing::Test {
 protected:
  void TearDown() override {
    settle_.Release(b_);
    (void)b_.DestroyStream(s_);
    EXPECT_EQ(b_.LiveResources().events, 0);
  }
  HostBackend b_{{.manual_completion = true}};
  Stream s_ = *b_.CreateStream(0);
  DiscardSettle settle_{std::chrono::milliseconds(40)};
};

TEST_F(DiscardSettleTest, NothingMarkedNothingWaited) {
  EXPECT_TRUE(settle_.WaitOnHost(b_));
  settle_.HoldStream(b_, s_);
  EXPECT_EQ(b_.CallCount("LaunchHostFunction"), 0);
  EXPECT_EQ(b_.CallCount("CreateTimingEvent"), 0);
  EXPECT_EQ(settle_.waits(), 0);
}

TEST_F(DiscardSettleTest, TheCallerWaitsWhatIsLeftOnceTheDiscardsCompleted) {
  settle_.Mark(b_, 0, s_);  // nothing pending: the discards completed at once
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(settle_.WaitOnHost(b_));
  EXPECT_GE(MsSince(t0), 30.0);
  EXPECT_EQ(settle_.waits(), 1);
  EXPECT_EQ(b_.CallCount("LaunchHostFunction"), 0) << "no host function on this path";
  // Time the caller spent since the discards counts.
  settle_.EndCycle();
  settle_.Mark(b_, 0, s_);
  std::this_thread::sleep_for(std::chrono::milliseconds(45));
  EXPECT_TRUE(settle_.WaitOnHost(b_));
  EXPECT_EQ(settle_.waits(), 1);
  // After the cycle's end there is nothing to wait for.
  settle_.EndCycle();
  EXPECT_TRUE(settle_.WaitOnHost(b_));
  EXPECT_EQ(settle_.waits(), 1);
}

TEST_F(DiscardSettleTest, DiscardsStillQueuedHoldTheStreamInstead) {
  ASSERT_TRUE(b_.EnqueueWork(s_).ok());  // the discards, still running
  settle_.Mark(b_, 0, s_);
  EXPECT_FALSE(settle_.WaitOnHost(b_));
  EXPECT_EQ(settle_.waits(), 0) << "the caller does not wait";
  settle_.HoldStream(b_, s_);
  EXPECT_EQ(settle_.waits(), 0) << "queued behind the discards";
  const Clock::time_point t1 = Clock::now();
  ASSERT_TRUE(b_.CompleteWork(s_).ok());  // the discards, then the hold
  EXPECT_GE(MsSince(t1), 35.0);
  EXPECT_EQ(settle_.waits(), 1);
}

// A backend whose timing events, elapsed times, streams or host functions
// fail gets no pause and no error (only speed is at stake), and nothing
// leaks.
TEST(DiscardSettleFallbackTest, FailingCallsMeanNoPause) {
  for (const FaultKind kind : {FaultKind::kEventCreate, FaultKind::kEventQuery, FaultKind::kOther}) {
    SCOPED_TRACE(FaultKindName(kind));
    HostBackend inner({.manual_completion = true});
    FaultInjectingBackend b(inner);
    Stream s = *inner.CreateStream(0);
    DiscardSettle settle(std::chrono::milliseconds(40));
    // Failing from the Mark on (its events or its stream cannot be made,
    // or the discards' completion cannot be read): no pause.
    b.SetPlan({.kind = kind, .probability = 1.0});
    settle.Mark(b, 0, s);
    EXPECT_TRUE(settle.WaitOnHost(b));
    EXPECT_EQ(settle.waits(), 0);
    settle.EndCycle();
    // Failing after the Mark, with the discards still queued: the stream
    // is held unless reading the completion or the hold itself fails.
    b.SetPlan({});
    ASSERT_TRUE(inner.EnqueueWork(s).ok());
    settle.Mark(b, 0, s);
    b.SetPlan({.kind = kind, .probability = 1.0});
    if (!settle.WaitOnHost(b)) settle.HoldStream(b, s);
    ASSERT_TRUE(inner.CompleteWork(s).ok());
    EXPECT_EQ(settle.waits(), kind == FaultKind::kEventCreate ? 1 : 0);
    settle.EndCycle();
    settle.Release(b);
    EXPECT_EQ(inner.LiveResources().events, 0);
    ASSERT_TRUE(inner.DestroyStream(s).ok());
  }
}

TEST(DiscardSettleOffTest, ZeroTurnsItOff) {
  HostBackend b;
  DiscardSettle settle(std::chrono::microseconds(0));
  settle.Mark(b, 0, kDefaultStream);
  EXPECT_TRUE(settle.WaitOnHost(b));
  settle.HoldStream(b, kDefaultStream);
  settle.Release(b);
  EXPECT_EQ(b.CallCount("CreateTimingEvent"), 0);
  EXPECT_EQ(b.CallCount("LaunchHostFunction"), 0);
  EXPECT_EQ(settle.waits(), 0);
}

class WakeSettleTest : public AllocatorTest {
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

TEST_F(WakeSettleTest, AWakeRightAfterASleepPausesBeforePopulating) {
  Remake("wake_settle_ms:40");
  void* weights = Alloc(8 * kMiB, 0, s1_);
  std::memset(weights, 7, 8 * kMiB);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_GE(MsSince(t0), 30.0);
  EXPECT_EQ(Stats().num_wake_settle_waits, 1);
  EXPECT_EQ(static_cast<unsigned char*>(weights)[8 * kMiB - 1], 7);
  // A caller that let the settle time pass pays nothing.
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(45));
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(Stats().num_wake_settle_waits, 1);
  // A Wake queued right behind a Sleep that has not run yet pauses on its
  // stream, after the Sleep.
  ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());  // a kernel still running
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(Stats().num_wake_settle_waits, 1) << "the caller does not wait";
  t0 = Clock::now();
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_GE(MsSince(t0), 30.0);
  EXPECT_EQ(Stats().num_wake_settle_waits, 2);
  ASSERT_TRUE(alloc_->ResetAccumulatedStats(0).ok());
  EXPECT_EQ(Stats().num_wake_settle_waits, 0);
  EXPECT_EQ(static_cast<unsigned char*>(weights)[8 * kMiB - 1], 7);
  ASSERT_TRUE(alloc_->Free(weights).ok());
}

TEST_F(WakeSettleTest, ARefusedWakeDoesNotPause) {
  Remake("wake_settle_ms:40");
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  const std::string before = Fingerprint(*alloc_);
  EXPECT_FALSE(alloc_->Wake(0, Stream{0xbad}).ok());
  EXPECT_EQ(Fingerprint(*alloc_), before);  // num_wake_settle_waits included
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(WakeSettleTest, AMoveOfASleepingAllocationRightAfterTheSleepPausesToo) {
  Remake("wake_settle_ms:20");
  void* a = Alloc(4 * kMiB, 0, s1_);
  void* b = Alloc(4 * kMiB, 0, s1_);
  std::memset(a, 3, 4 * kMiB);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s1_).ok());
  EXPECT_EQ(Stats().num_wake_settle_waits, 1);
  EXPECT_EQ(static_cast<unsigned char*>(a)[4 * kMiB - 1], 3);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  for (void* p : {a, b}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(WakeSettleTest, OffMeansNoPause) {
  Remake("wake_settle_ms:0");
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(backend_->CallCount("CreateTimingEvent"), 0);
  EXPECT_EQ(backend_->CallCount("LaunchHostFunction"), 0);
  EXPECT_EQ(Stats().num_wake_settle_waits, 0);
  ASSERT_TRUE(alloc_->Free(a).ok());
}

}  // namespace
}  // namespace cma
