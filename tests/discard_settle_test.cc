// The pause between a Sleep's discards and a Wake's population
// (allocator/discard_settle.h): queued in stream order, as long as the
// settle time left since the discards completed, counted, and absent when
// turned off or when nothing was discarded.
#include "allocator/discard_settle.h"

#include <chrono>
#include <cstring>
#include <thread>

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

TEST(DiscardSettleTest, HoldsTheStreamForWhatIsLeftOfTheSettleTime) {
  HostBackend b({.manual_completion = true});
  Stream s = *b.CreateStream(0);
  DiscardSettle settle(std::chrono::milliseconds(40));
  settle.Hold(b, s, /*end_cycle=*/true);
  EXPECT_EQ(b.CallCount("LaunchHostFunction"), 0) << "nothing discarded: no pause";
  ASSERT_TRUE(b.EnqueueWork(s).ok());  // the discards, still running
  settle.Mark(b, s);
  settle.Hold(b, s, /*end_cycle=*/true);
  EXPECT_EQ(b.CallCount("LaunchHostFunction"), 2);
  EXPECT_EQ(settle.waits(), 0) << "queued, not run: the stream has not got there";
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(b.CompleteWork(s).ok());  // the mark, then the hold right after it
  EXPECT_GE(MsSince(t0), 35.0);
  EXPECT_EQ(settle.waits(), 1);
  // The cycle ended: the next hold waits only for a new mark.
  settle.Hold(b, s, /*end_cycle=*/true);
  EXPECT_EQ(b.CallCount("LaunchHostFunction"), 2);
  // Time spent between the discards and the population counts.
  ASSERT_TRUE(b.EnqueueWork(s).ok());
  settle.Mark(b, s);
  ASSERT_TRUE(b.CompleteWork(s).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(45));
  settle.Hold(b, s, /*end_cycle=*/false);
  ASSERT_TRUE(b.CompleteWork(s).ok());
  EXPECT_EQ(settle.waits(), 1);
  ASSERT_TRUE(b.DestroyStream(s).ok());
}

TEST(DiscardSettleTest, ZeroTurnsItOff) {
  HostBackend b;
  DiscardSettle settle(std::chrono::microseconds(0));
  settle.Mark(b, kDefaultStream);
  settle.Hold(b, kDefaultStream, true);
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
  // A kernel still running: the Sleep and the Wake queue behind it.
  ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(Stats().num_wake_settle_waits, 0) << "queued on the stream, not waited on the host";
  const Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_GE(MsSince(t0), 35.0);
  EXPECT_EQ(Stats().num_wake_settle_waits, 1);
  EXPECT_EQ(static_cast<unsigned char*>(weights)[8 * kMiB - 1], 7);
  // A caller that let the settle time pass pays nothing.
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(45));
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_EQ(Stats().num_wake_settle_waits, 1);
  ASSERT_TRUE(alloc_->ResetAccumulatedStats(0).ok());
  EXPECT_EQ(Stats().num_wake_settle_waits, 0);
  ASSERT_TRUE(alloc_->Free(weights).ok());
}

TEST_F(WakeSettleTest, AMoveOfASleepingAllocationPausesTooAndTheWakeAfterIt) {
  Remake("wake_settle_ms:20");
  void* a = Alloc(4 * kMiB, 0, s1_);
  void* b = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  const std::int64_t launched = backend_->CallCount("LaunchHostFunction");
  ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s1_).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  // One hold before the Move's population, one before the Wake's.
  EXPECT_EQ(backend_->CallCount("LaunchHostFunction"), launched + 2);
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_GE(Stats().num_wake_settle_waits, 1);
  for (void* p : {a, b}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(WakeSettleTest, OffMeansNoHostFunctions) {
  Remake("wake_settle_ms:0");
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_EQ(backend_->CallCount("LaunchHostFunction"), 0);
  EXPECT_EQ(Stats().num_wake_settle_waits, 0);
  ASSERT_TRUE(alloc_->Free(a).ok());
}

}  // namespace
}  // namespace cma
