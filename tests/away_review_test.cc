// The away state's review findings (issue 48), each kept as a regression
// test: room made from pages several streams share, a batch over two
// devices, Wake and the edge pages, a Move within the budget, a free while
// a pool is allocated to, and threads (run under TSAN in CI).
#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"
#include "tests/test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr MemPoolId kPool{1, 0};

class AwayReviewTest : public AllocatorTest {
 protected:
  void Remake(const std::string& config, int devices = 1) {
    Make({.device_count = devices, .device_capacity = std::size_t{1} << 30}, config);
  }
  std::int64_t AwayBytes(int d = 0) { return Stats(d).away_bytes[kAllPools].current; }
  std::int64_t Reserved(int d = 0) { return Stats(d).reserved_bytes[kAllPools].current; }
  // On `device` (budget 64M = 32 pages): `a` (40M, 18 inner pages) sent
  // away; 14 more pages live; two idle pages: page 20 (free block X of s1
  // alone) and page 21, shared by free X (s1) and free Y (s2): a "mixed"
  // page, which DiscardIdlePages does not discard unless settled.
  void* MixedSetup(int device) {
    Stream s1 = *backend_->CreateStream(device), s2 = *backend_->CreateStream(device);
    streams_.push_back(s1);
    streams_.push_back(s2);
    void* a = Alloc(40 * kMiB, device, s1);
    EXPECT_TRUE(alloc_->SendAway({&a, 1}, kDefaultStream).ok());
    void* x = Alloc(3 * kMiB, device, s1);
    void* y = Alloc(2 * kMiB, device, s2);  // [43M, 45M): page 22 shared with z
    live_.push_back(Alloc(19 * kMiB, device, s2));
    live_.push_back(Alloc(4 * kMiB, device, s2));
    EXPECT_TRUE(alloc_->Free(x).ok());
    EXPECT_TRUE(alloc_->Free(y).ok());
    EXPECT_EQ(Reserved(device), static_cast<std::int64_t>(32 * kMiB));
    EXPECT_EQ(Stats(device).idle_populated_bytes, static_cast<std::int64_t>(4 * kMiB));
    return a;
  }
  void TearDown() override {
    for (void* p : live_) EXPECT_TRUE(alloc_->Free(p).ok());
    AllocatorTest::TearDown();
  }
  std::vector<void*> live_;
  std::vector<Stream> streams_;
};

// The room BringBack counts includes an idle page that free blocks of two
// streams share: it is discarded after waiting for both (not refused after
// discarding the others, which would change the state of a refused call).
TEST_F(AwayReviewTest, BringBackMakesRoomFromAPageTwoStreamsShare) {
  Remake("managed_budget:64M");
  void* a = MixedSetup(0);
  ExpectInvariants();
  absl::Status s = alloc_->BringBack({&a, 1}, kDefaultStream);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(AwayBytes(), 0);
  EXPECT_LE(Reserved(), static_cast<std::int64_t>(64 * kMiB));
  ExpectInvariants();
  live_.push_back(a);
}

// A batch over two devices, one of which makes its room that way: both
// come back.
TEST_F(AwayReviewTest, ATwoDeviceBatchComesBackWhole) {
  Remake("managed_budget:64M", 2);
  void* a0 = Alloc(40 * kMiB, 0);
  ASSERT_TRUE(alloc_->SendAway({&a0, 1}, kDefaultStream).ok());
  void* a1 = MixedSetup(1);
  live_.push_back(a0);
  live_.push_back(a1);
  void* both[] = {a0, a1};
  absl::Status s = alloc_->BringBack(both, kDefaultStream);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(AwayBytes(0), 0);
  EXPECT_EQ(AwayBytes(1), 0);
  EXPECT_EQ(backend_->PageLocation(static_cast<char*>(a0) + 8 * kMiB), 0);
  ExpectInvariants();
}

// Sent away and brought back while asleep (level 0): only the inner pages
// moved, and Wake brings the first and last pages back with the rest.
TEST_F(AwayReviewTest, WakeBringsTheEdgePagesOfABroughtBackBlock) {
  Remake("");
  Stream s = *backend_->CreateStream(0);
  void* a = Alloc(20 * kMiB, 0, s);
  ASSERT_TRUE(alloc_->Sleep(0, s, SleepLevel::kMigrate).ok());
  EXPECT_EQ(backend_->PageLocation(a), kPageOnHost);
  ASSERT_TRUE(alloc_->SendAway({&a, 1}, s).ok());
  ASSERT_TRUE(alloc_->BringBack({&a, 1}, s).ok());
  ASSERT_TRUE(alloc_->Wake(0, s).ok());
  ExpectInvariants();
  EXPECT_EQ(backend_->PageLocation(static_cast<char*>(a) + 8 * kMiB), 0);
  EXPECT_EQ(backend_->PageLocation(a), 0) << "first page left on the host by Wake";
  EXPECT_EQ(backend_->PageLocation(static_cast<char*>(a) + 19 * kMiB), 0)
      << "last page left on the host by Wake";
  ASSERT_TRUE(alloc_->Free(a).ok());
}

// A Move to the device of an away allocation needs the room BringBack
// does: refused the same way, changing nothing, within the budget.
TEST_F(AwayReviewTest, AMoveToTheDeviceOfAnAwayAllocationKeepsTheBudget) {
  Remake("managed_budget:64M");
  void* a = Alloc(40 * kMiB);
  ASSERT_TRUE(alloc_->SendAway({&a, 1}, kDefaultStream).ok());
  live_.push_back(a);
  live_.push_back(Alloc(30 * kMiB));  // the room SendAway made
  EXPECT_EQ(alloc_->BringBack({&a, 1}, kDefaultStream).code(),
            absl::StatusCode::kResourceExhausted);
  const std::string before = Fingerprint(*alloc_);
  EXPECT_EQ(alloc_->Move(a, Location::Device(0), kDefaultStream).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_LE(Reserved(), static_cast<std::int64_t>(64 * kMiB));
  // To the host it stays away.
  ASSERT_TRUE(alloc_->Move(a, Location::Host(), kDefaultStream).ok());
  EXPECT_EQ(AwayBytes(), static_cast<std::int64_t>(36 * kMiB));
  ExpectInvariants();
}

using AwayQuietTest = MemPoolFixture;

// The free of an away allocation while a pool is allocated to (a capture
// may be under way) waits for the context's end to discard its pages.
TEST_F(AwayQuietTest, TheFreeOfAnAwayBlockMakesNoCallWhileQuiet) {
  void* a = Alloc(20 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->SendAway({&a, 1}, s1_).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  backend_->SetCapturing(s1_, true);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  const std::int64_t discards = backend_->CallCount("DiscardBatch");
  ASSERT_TRUE(alloc_->Free(a).ok());
  EXPECT_EQ(UncapturableCalls(), before)
      << "free made a capture-breaking call while quiet (DiscardBatch +"
      << backend_->CallCount("DiscardBatch") - discards << ")";
  EXPECT_EQ(backend_->CallCount("DiscardBatch"), discards) << "deferred to the context's end";
  backend_->SetCapturing(s1_, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

}  // namespace
}  // namespace cma

namespace cma {
namespace {

// Threads (run under --config=tsan): SendAway/BringBack batches racing
// allocations, frees, RecordStream, snapshots and stats on two devices.
TEST(AwayThreads, SendAwayBringBackRaceTheRest) {
  HostBackend backend({.device_count = 2, .device_capacity = std::size_t{1} << 30});
  auto alloc = CachingManagedAllocator::Create(backend, "managed_budget:256M");
  ASSERT_TRUE(alloc.ok());
  CachingManagedAllocator& a = **alloc;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&a, &backend, t] {
      Stream s = *backend.CreateStream(t % 2);
      for (int i = 0; i < 200; ++i) {
        void* p[3];
        for (int k = 0; k < 3; ++k) {
          auto r = a.Allocate((6 + 4 * k + i % 5) * kMiB, (t + k) % 2, kDefaultStream);
          p[k] = r.ok() ? *r : nullptr;
        }
        std::vector<void*> live;
        for (void* q : p) if (q != nullptr) live.push_back(q);
        (void)a.SendAway(live, kDefaultStream);
        if (!live.empty()) (void)a.RecordStream(live[0], s);
        (void)a.GetStats(t % 2);
        (void)a.Snapshot();
        (void)a.BringBack(live, kDefaultStream);
        if (i % 3 == 0) (void)a.SendAway(live, kDefaultStream);
        for (void* q : live) EXPECT_TRUE(a.Free(q).ok());
        if (i % 50 == 0) (void)a.EmptyCache();
      }
      EXPECT_TRUE(a.ForgetStream(s).ok());
      EXPECT_TRUE(backend.DestroyStream(s).ok());
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  EXPECT_EQ(a.GetStats(0)->away_bytes[kAllPools].current, 0);
  EXPECT_EQ(a.GetStats(1)->away_bytes[kAllPools].current, 0);
}

}  // namespace
}  // namespace cma
