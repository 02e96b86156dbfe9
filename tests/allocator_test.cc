// CachingManagedAllocator on the host backend: pools, rounding, split/merge,
// stream-ordered reuse, OOM, stats, empty_cache and every bad input.
#include <cstring>
#include <set>

#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

TEST_F(AllocatorTest, AllocatedMemoryIsWritable) {
  char* p = static_cast<char*>(Alloc(1000));
  ASSERT_NE(p, nullptr);
  std::memset(p, 7, 1000);
  EXPECT_EQ(p[999], 7);
  EXPECT_TRUE(alloc_->Free(p).ok());
}

TEST_F(AllocatorTest, SmallRequestsShareOneTwoMiBSegment) {
  Make({}, "segments:classic");
  void* a = Alloc(1000);
  void* b = Alloc(3000);
  DeviceStats s = Stats();
  EXPECT_EQ(s.segment[kSmallPool].current, 1);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 2 << 20);
  EXPECT_EQ(s.allocated_bytes[kAllPools].current, 1024 + 3072);
  EXPECT_EQ(s.requested_bytes[kAllPools].current, 4000);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 1024);
  EXPECT_EQ(backend_->CallCount("AllocateManaged"), 1);
  alloc_->Free(a).IgnoreError();
  alloc_->Free(b).IgnoreError();
}

TEST_F(AllocatorTest, LargeRequestsUseTwentyMiBSegments) {
  Make({}, "segments:classic");
  void* a = Alloc(3 << 20);
  DeviceStats s = Stats();
  EXPECT_EQ(s.segment[kLargePool].current, 1);
  EXPECT_EQ(s.reserved_bytes[kLargePool].current, 20 << 20);
  void* b = Alloc(5 << 20);  // fits in the remainder
  EXPECT_EQ(Stats().segment[kAllPools].current, 1);
  alloc_->Free(a).IgnoreError();
  alloc_->Free(b).IgnoreError();
}

TEST_F(AllocatorTest, HugeRequestsGetExactSegments) {
  Make({}, "segments:classic");
  void* a = Alloc((64 << 20) + 1);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 66 << 20);
  alloc_->Free(a).IgnoreError();
}

TEST_F(AllocatorTest, SteadyStateMakesNoBackendCall) {
  void* p = Alloc(1 << 20);
  ASSERT_TRUE(alloc_->Free(p).ok());
  const auto calls = backend_->TotalCalls();
  for (int i = 0; i < 1000; ++i) {
    void* q = Alloc(1 << 20);
    ASSERT_EQ(q, p);
    ASSERT_TRUE(alloc_->Free(q).ok());
  }
  EXPECT_EQ(backend_->TotalCalls(), calls);
}

TEST_F(AllocatorTest, FreedBlocksMergeBackIntoOneBlock) {
  Make({}, "segments:classic");
  // Three blocks fill one 2 MiB small segment exactly.
  void* a = Alloc(512 << 10);
  void* b = Alloc(512 << 10);
  void* c = Alloc(1 << 20);
  EXPECT_EQ(Stats().segment[kAllPools].current, 1);
  ASSERT_TRUE(alloc_->Free(b).ok());
  EXPECT_EQ(Stats().inactive_split[kAllPools].current, 1);
  ASSERT_TRUE(alloc_->Free(a).ok());
  // Merging is deferred until a lookup misses: 1 MiB fits only in a and b
  // merged back together.
  void* merged = Alloc(1 << 20);
  EXPECT_EQ(merged, a);
  EXPECT_EQ(Stats().segment[kAllPools].current, 1);
  ASSERT_TRUE(alloc_->Free(merged).ok());
  ASSERT_TRUE(alloc_->Free(c).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(Stats().inactive_split[kAllPools].current, 0);
}

TEST_F(AllocatorTest, SteadyCycleNeitherSplitsNorMerges) {
  void* keep = Alloc(4096);
  void* p = Alloc(1 << 20);
  ASSERT_TRUE(alloc_->Free(p).ok());
  for (int i = 0; i < 100; ++i) {
    void* q = Alloc(1 << 20);
    ASSERT_EQ(q, p);
    ASSERT_TRUE(alloc_->Free(q).ok());
  }
  // Still two free pieces besides `keep`: p's block and the tail.
  EXPECT_EQ(Stats().inactive_split[kAllPools].current, 2);
  ExpectInvariants();
  alloc_->Free(keep).IgnoreError();
}

TEST_F(AllocatorTest, BestFitPicksSmallestFreeBlock) {
  void* big = Alloc(64 << 10);
  void* sep1 = Alloc(512);
  void* small = Alloc(8 << 10);
  void* sep2 = Alloc(512);
  alloc_->Free(big).IgnoreError();
  alloc_->Free(small).IgnoreError();
  EXPECT_EQ(Alloc(8 << 10), small);
  EXPECT_EQ(Alloc(64 << 10), big);
  for (void* p : {big, sep1, small, sep2}) alloc_->Free(p).IgnoreError();
}

TEST_F(AllocatorTest, SmallAndLargePoolsNeverMix) {
  Make({}, "release_before_peak:0,segments:classic");
  void* l = Alloc(4 << 20);
  alloc_->Free(l).IgnoreError();
  void* s = Alloc(4096);
  EXPECT_EQ(Stats().segment[kSmallPool].current, 1);
  EXPECT_EQ(Stats().segment[kLargePool].current, 1);
  alloc_->Free(s).IgnoreError();
}

TEST_F(AllocatorTest, MaxSplitSizeKeepsOversizeBlocksWhole) {
  Make({}, "max_split_size_mb:32,release_before_peak:0,segments:classic");
  void* big = Alloc(40 << 20);
  alloc_->Free(big).IgnoreError();
  // A 2 MiB request may not carve the 40 MiB block.
  void* small = Alloc(2 << 20);
  EXPECT_NE(small, big);
  EXPECT_EQ(Stats().segment[kLargePool].current, 2);
  // A 38 MiB request takes it whole.
  void* again = Alloc(38 << 20);
  EXPECT_EQ(again, big);
  alloc_->Free(small).IgnoreError();
  alloc_->Free(again).IgnoreError();
}

TEST_F(AllocatorTest, RoundupPower2DivisionsApplies) {
  Make({}, "roundup_power2_divisions:4");
  void* p = Alloc((5 << 20) + 1);
  EXPECT_EQ(Stats().allocated_bytes[kAllPools].current, 6 << 20);
  alloc_->Free(p).IgnoreError();
}

TEST_F(AllocatorTest, DevicesHaveSeparatePools) {
  void* a = Alloc(4096, 0);
  alloc_->Free(a).IgnoreError();
  void* b = Alloc(4096, 1);
  EXPECT_NE(a, b);
  EXPECT_EQ(Stats(0).segment[kAllPools].current, 1);
  EXPECT_EQ(Stats(1).segment[kAllPools].current, 1);
  EXPECT_EQ(*alloc_->DeviceOf(b), 1);
  alloc_->Free(b).IgnoreError();
}

// ---------------------------------------------------------------- streams

class StreamTest : public AllocatorTest {
 protected:
  void SetUp() override {
    // Pure stream-ordering semantics: no release of idle segments on growth.
    Make({.device_count = 2, .device_capacity = std::size_t{1} << 30, .manual_completion = true},
         "release_before_peak:0");
    s1_ = *backend_->CreateStream(0);
    s2_ = *backend_->CreateStream(0);
  }
  void TearDown() override {
    AllocatorTest::TearDown();
    backend_->DestroyStream(s1_).IgnoreError();
    backend_->DestroyStream(s2_).IgnoreError();
  }
  Stream s1_, s2_;
};

TEST_F(StreamTest, SameStreamReusesAtOnceEvenWithPendingWork) {
  void* p = Alloc(4096, 0, s1_);
  ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());  // a kernel uses p
  ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(Alloc(4096, 0, s1_), p);  // stream order makes this safe
  alloc_->Free(p).IgnoreError();
}

TEST_F(StreamTest, OtherStreamWaitsForPendingWork) {
  Make({.device_count = 2, .device_capacity = std::size_t{1} << 30, .manual_completion = true},
       "release_before_peak:0,segments:classic");
  s1_ = *backend_->CreateStream(0);
  s2_ = *backend_->CreateStream(0);
  void* p = Alloc(4096, 0, s1_);
  ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  void* q = Alloc(4096, 0, s2_);
  EXPECT_NE(q, p);  // s1's kernel may still touch p
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  void* r1 = Alloc(1 << 20, 0, s2_);  // fits s2's own segment
  EXPECT_EQ(Stats().num_cross_stream_reuse, 0);
  void* r2 = Alloc(1 << 20, 0, s2_);  // does not: looks at s1's cache
  // Once s1 is idle, its free segment may serve s2.
  EXPECT_EQ(r2, p);
  EXPECT_EQ(Stats().num_cross_stream_reuse, 1);
  EXPECT_EQ(Stats().segment[kAllPools].current, 2);
  for (void* x : {q, r1, r2}) alloc_->Free(x).IgnoreError();
}

TEST_F(StreamTest, CrossStreamReuseAfterCompletion) {
  void* p = Alloc(8 << 20, 0, s1_);
  ASSERT_TRUE(alloc_->Free(p).ok());
  void* q = Alloc(8 << 20, 0, s2_);  // s1 has no pending work
  EXPECT_EQ(q, p);
  EXPECT_EQ(Stats().segment[kAllPools].current, 1);
  alloc_->Free(q).IgnoreError();
}

TEST_F(StreamTest, RecordStreamDelaysReuseUntilEventCompletes) {
  void* p = Alloc(4096, 0, s1_);
  ASSERT_TRUE(alloc_->RecordStream(p, s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // s2's kernel reads p
  ASSERT_TRUE(alloc_->Free(p).ok());
  DeviceStats s = Stats();
  EXPECT_EQ(s.allocation[kAllPools].current, 0);
  EXPECT_EQ(s.active[kAllPools].current, 1);  // pending free
  ExpectInvariants();
  // Not even s1 may reuse it while s2's kernel runs.
  void* q = Alloc(4096, 0, s1_);
  EXPECT_NE(q, p);
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  void* r = Alloc(4096, 0, s1_);
  EXPECT_EQ(r, p);
  EXPECT_EQ(Stats().active[kAllPools].current, 2);
  for (void* x : {q, r}) alloc_->Free(x).IgnoreError();
}

TEST_F(StreamTest, RecordStreamOnOwnStreamIsNoop) {
  void* p = Alloc(4096, 0, s1_);
  ASSERT_TRUE(alloc_->RecordStream(p, s1_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(Stats().active[kAllPools].current, 0);
  EXPECT_EQ(backend_->CallCount("RecordEvent"), 0);
}

TEST_F(StreamTest, RecordStreamTwiceRecordsOneEvent) {
  void* p = Alloc(4096, 0, s1_);
  ASSERT_TRUE(alloc_->RecordStream(p, s2_).ok());
  ASSERT_TRUE(alloc_->RecordStream(p, s2_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(backend_->CallCount("RecordEvent"), 1);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
}

TEST_F(StreamTest, EventsAreReusedNotRecreated) {
  for (int i = 0; i < 10; ++i) {
    void* p = Alloc(4096, 0, s1_);
    ASSERT_TRUE(alloc_->RecordStream(p, s2_).ok());
    ASSERT_TRUE(alloc_->Free(p).ok());
  }
  EXPECT_EQ(backend_->CallCount("CreateEvent"), 1);
}

TEST_F(StreamTest, EmptyCacheWaitsForPendingFrees) {
  void* p = Alloc(4096, 0, s1_);
  ASSERT_TRUE(alloc_->RecordStream(p, s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(backend_->PendingWork(s2_), 0);  // it had to wait for the kernel
}

TEST_F(StreamTest, FreeBlocksOfTwoStreamsDoNotMerge) {
  void* a = Alloc(4096, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(4096, 0, s2_);  // steals from idle s1
  void* c = Alloc(4096, 0, s1_);  // s1 gets a fresh segment (its block went to s2)
  ExpectInvariants();
  for (void* x : {b, c}) ASSERT_TRUE(alloc_->Free(x).ok());
  ExpectInvariants();
}

TEST_F(StreamTest, ReleaseBeforePeakWaitsForQueuedWork) {
  Make({.device_count = 2, .device_capacity = std::size_t{1} << 30, .manual_completion = true},
       "release_before_peak:1,segments:classic");
  s1_ = *backend_->CreateStream(0);
  s2_ = *backend_->CreateStream(0);
  void* p = Alloc(4096, 0, s1_);
  ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  // s2 cannot take s1's busy block; growing would raise the high-water mark,
  // so the idle segment is released, but only after s1's work completes.
  void* q = Alloc(4096, 0, s2_);
  EXPECT_EQ(backend_->PendingWork(s1_), 0);
  EXPECT_EQ(Stats().num_device_free, 1);
  alloc_->Free(q).IgnoreError();
}

TEST_F(StreamTest, InvalidStreamIsRejected) {
  const std::string before = Fingerprint(*alloc_);
  auto p = alloc_->Allocate(4096, 0, 99999);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("invalid stream"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
}

TEST_F(StreamTest, StreamOfAnotherDeviceIsRejected) {
  Stream other = *backend_->CreateStream(1);
  auto p = alloc_->Allocate(4096, 0, other);
  EXPECT_THAT(p.status().message(), HasSubstr("belongs to device 1"));
  backend_->DestroyStream(other).IgnoreError();
}

TEST_F(StreamTest, RecordStreamWithBadStreamChangesNothing) {
  void* p = Alloc(4096, 0, s1_);
  const std::string before = Fingerprint(*alloc_);
  EXPECT_FALSE(alloc_->RecordStream(p, 4242).ok());
  EXPECT_EQ(Fingerprint(*alloc_), before);
  ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(backend_->CallCount("RecordEvent"), 0);
}

// ---------------------------------------------------------------- OOM

TEST_F(AllocatorTest, ReleaseBeforePeakGivesBackIdleSegments) {
  Make({}, "release_before_peak:1,segments:classic");
  void* a = Alloc(40 << 20);
  ASSERT_TRUE(alloc_->Free(a).ok());
  // A larger request would raise the high-water mark: the idle 40 MiB go first.
  void* b = Alloc(50 << 20);
  DeviceStats s = Stats();
  EXPECT_EQ(s.num_device_free, 1);
  EXPECT_EQ(s.reserved_bytes[kAllPools].peak, 50 << 20);
  ASSERT_TRUE(alloc_->Free(b).ok());
  // Below the mark the cache is kept.
  void* c = Alloc(10 << 20);
  EXPECT_EQ(Stats().num_device_free, 1);
  EXPECT_EQ(c, b);
  alloc_->Free(c).IgnoreError();
}

TEST_F(AllocatorTest, OomReleasesCacheAndRetries) {
  Make({.device_count = 1, .device_capacity = 64 << 20}, "release_before_peak:0,segments:classic");
  void* a = Alloc(40 << 20);
  ASSERT_TRUE(alloc_->Free(a).ok());
  // 40 MiB sit in the cache; 50 MiB need it back.
  void* b = Alloc(50 << 20);
  ASSERT_NE(b, nullptr);
  DeviceStats s = Stats();
  EXPECT_EQ(s.num_alloc_retries, 1);
  EXPECT_EQ(s.num_ooms, 0);
  EXPECT_EQ(s.num_device_free, 1);
  alloc_->Free(b).IgnoreError();
}

TEST_F(AllocatorTest, OomErrorCarriesStats) {
  Make({.device_count = 1, .device_capacity = 64 << 20});
  void* a = Alloc(40 << 20);
  auto b = alloc_->Allocate(50 << 20, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("out of memory on device 0"));
  EXPECT_THAT(b.status().message(), HasSubstr("tried to allocate 50.00 MiB"));
  EXPECT_THAT(b.status().message(), HasSubstr("40.00 MiB allocated"));
  EXPECT_THAT(b.status().message(), HasSubstr("num_ooms=1"));
  EXPECT_EQ(Stats().num_ooms, 1);
  // The allocator still works.
  void* c = Alloc(8 << 20);
  ASSERT_NE(c, nullptr);
  for (void* x : {a, c}) alloc_->Free(x).IgnoreError();
}

TEST_F(AllocatorTest, ManagedBudgetCapsReservation) {
  Make({.device_count = 1, .device_capacity = 1 << 30}, "managed_budget:64M");
  void* a = Alloc(40 << 20);  // the budget is planned at the device's first use
  EXPECT_EQ(Stats().managed_budget_bytes, 64 << 20);
  auto b = alloc_->Allocate(30 << 20, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("managed budget"));
  alloc_->Free(a).IgnoreError();
}

TEST_F(AllocatorTest, BudgetDefaultsToFreeMemoryAtFirstUse) {
  Make({.device_count = 1, .device_capacity = 256 << 20}, "managed_budget:0.5");
  EXPECT_EQ(Stats().managed_budget_bytes, 0);  // nothing planned yet
  void* a = Alloc(1 << 20);
  EXPECT_EQ(Stats().managed_budget_bytes, 128 << 20);
  alloc_->Free(a).IgnoreError();
}

TEST_F(AllocatorTest, OomWaitsForPendingFreesBeforeFailing) {
  Make({.device_count = 1, .device_capacity = 64 << 20, .manual_completion = true}, "segments:classic");
  Stream s1 = *backend_->CreateStream(0), s2 = *backend_->CreateStream(0);
  void* a = Alloc(40 << 20, 0, s1);
  ASSERT_TRUE(alloc_->RecordStream(a, s2).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(40 << 20, 0, s1);  // must wait for s2's kernel, then reuse
  EXPECT_EQ(b, a);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_EQ(Stats().num_ooms, 0);
  alloc_->Free(b).IgnoreError();
  alloc_.reset();
  backend_->DestroyStream(s1).IgnoreError();
  backend_->DestroyStream(s2).IgnoreError();
}

// ---------------------------------------------------------------- bad input

TEST_F(AllocatorTest, SizeZeroIsAnErrorAndChangesNothing) {
  const std::string before = Fingerprint(*alloc_);
  auto p = alloc_->Allocate(0, 0);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(), HasSubstr("0 bytes"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
}

TEST_F(AllocatorTest, HugeSizeIsAnErrorAndChangesNothing) {
  void* keep = Alloc(4096);
  const std::string before = Fingerprint(*alloc_);
  for (std::size_t n : {std::size_t{9} << 30, ~std::size_t{0}, ~std::size_t{0} - 100}) {
    auto p = alloc_->Allocate(n, 0);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(p.status().message(), HasSubstr("exceeds the total memory of device 0"));
  }
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_EQ(Stats().num_ooms, 0);
  alloc_->Free(keep).IgnoreError();
}

TEST_F(AllocatorTest, InvalidDeviceIsAnError) {
  const std::string before = Fingerprint(*alloc_);
  for (int d : {-2, 2, 1000}) {  // -1 is the host pool (host_pool_test)
    auto p = alloc_->Allocate(4096, d);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr("invalid device"));
  }
  EXPECT_FALSE(alloc_->GetStats(5).ok());
  EXPECT_FALSE(alloc_->ResetPeakStats(-1).ok());
  EXPECT_EQ(Fingerprint(*alloc_), before);
}

TEST_F(AllocatorTest, DoubleFreeIsAnErrorAndChangesNothing) {
  void* p = Alloc(4096);
  void* keep = Alloc(4096);
  ASSERT_TRUE(alloc_->Free(p).ok());
  const std::string before = Fingerprint(*alloc_);
  absl::Status s = alloc_->Free(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("double free"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  alloc_->Free(keep).IgnoreError();
}

TEST_F(AllocatorTest, DoubleFreeOfPendingBlockIsAnError) {
  Make({.manual_completion = true});
  Stream s2 = *backend_->CreateStream(0);
  void* p = Alloc(4096);
  ASSERT_TRUE(alloc_->RecordStream(p, s2).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  const std::string before = Fingerprint(*alloc_);
  EXPECT_THAT(alloc_->Free(p).message(), HasSubstr("double free"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  alloc_.reset();
  backend_->DestroyStream(s2).IgnoreError();
}

TEST_F(AllocatorTest, ForeignPointerIsAnError) {
  void* keep = Alloc(4096);
  const std::string before = Fingerprint(*alloc_);
  int local;
  absl::Status s = alloc_->Free(&local);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("foreign pointer"));
  EXPECT_THAT(alloc_->Free(nullptr).message(), HasSubstr("null pointer"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  alloc_->Free(keep).IgnoreError();
}

TEST_F(AllocatorTest, InteriorPointerIsAnError) {
  char* p = static_cast<char*>(Alloc(4096));
  const std::string before = Fingerprint(*alloc_);
  absl::Status s = alloc_->Free(p + 100);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("points 100 bytes into a block"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  alloc_->Free(p).IgnoreError();
}

TEST_F(AllocatorTest, RecordStreamOnForeignPointerIsAnError) {
  int local;
  EXPECT_THAT(alloc_->RecordStream(&local, kDefaultStream).message(),
              HasSubstr("not an allocation"));
}

TEST_F(AllocatorTest, BadConfigIsRejectedAtCreate) {
  HostBackend b;
  auto a = CachingManagedAllocator::Create(b, "prefetch:sometimes");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  auto c = CachingManagedAllocator::Create(b, "accessed_by:7");
  EXPECT_THAT(c.status().message(), HasSubstr("accessed_by names device 7"));
  EXPECT_EQ(b.LiveResources().managed_allocations, 0);
}

// ---------------------------------------------------------------- stats, cache

TEST_F(AllocatorTest, StatsFollowPyTorchSemantics) {
  Make({}, "segments:classic");
  void* a = Alloc(1000);
  void* b = Alloc(3 << 20);
  DeviceStats s = Stats();
  EXPECT_EQ(s.allocation[kAllPools].current, 2);
  EXPECT_EQ(s.allocation[kSmallPool].current, 1);
  EXPECT_EQ(s.allocation[kLargePool].current, 1);
  EXPECT_EQ(s.active_bytes[kAllPools].current, 1024 + (3 << 20));
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, (2 << 20) + (20 << 20));
  EXPECT_EQ(s.num_device_alloc, 2);
  alloc_->Free(a).IgnoreError();
  alloc_->Free(b).IgnoreError();
  s = Stats();
  EXPECT_EQ(s.allocation[kAllPools].current, 0);
  EXPECT_EQ(s.allocation[kAllPools].allocated, 2);
  EXPECT_EQ(s.allocation[kAllPools].freed, 2);
  EXPECT_EQ(s.allocated_bytes[kAllPools].peak, 1024 + (3 << 20));
  EXPECT_EQ(s.requested_bytes[kAllPools].peak, 1000 + (3 << 20));
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 22 << 20);  // cached
  auto flat = s.Flatten();
  EXPECT_EQ(flat["allocated_bytes.all.peak"], 1024 + (3 << 20));
  EXPECT_EQ(flat["segment.large_pool.current"], 1);
  EXPECT_TRUE(flat.count("num_alloc_retries"));
  EXPECT_TRUE(flat.count("inactive_split_bytes.small_pool.freed"));
}

TEST_F(AllocatorTest, ResetPeakAndAccumulated) {
  void* a = Alloc(1 << 20);
  alloc_->Free(a).IgnoreError();
  ASSERT_TRUE(alloc_->ResetPeakStats(0).ok());
  EXPECT_EQ(Stats().allocated_bytes[kAllPools].peak, 0);
  ASSERT_TRUE(alloc_->ResetAccumulatedStats(0).ok());
  EXPECT_EQ(Stats().allocation[kAllPools].allocated, 0);
  EXPECT_EQ(Stats().num_device_alloc, 0);
}

TEST_F(AllocatorTest, EmptyCacheReleasesOnlyFullyFreeSegments) {
  Make({}, "segments:classic");
  void* a = Alloc(4096);         // small segment stays: a is live
  void* b = Alloc(3 << 20);      // large segment goes after free
  alloc_->Free(b).IgnoreError();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  DeviceStats s = Stats();
  EXPECT_EQ(s.segment[kAllPools].current, 1);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 2 << 20);
  EXPECT_EQ(s.num_device_free, 1);
  alloc_->Free(a).IgnoreError();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(backend_->LiveResources().managed_allocations, 0);
}

TEST_F(AllocatorTest, SnapshotDescribesSegmentsAndBlocks) {
  void* a = Alloc(1000);
  auto snap = alloc_->Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].segment_type, "large");  // one arena carves every size
  EXPECT_EQ(snap[0].allocated_size, 1024u);
  EXPECT_EQ(snap[0].requested_size, 1000u);
  ASSERT_EQ(snap[0].blocks.size(), 2u);
  EXPECT_EQ(snap[0].blocks[0].state, "active_allocated");
  EXPECT_EQ(snap[0].blocks[1].state, "inactive");
  alloc_->Free(a).IgnoreError();
}

// PyTorch's tools count blocks (TestBlockStateAbsorption): free neighbours
// that Free leaves apart until CoalesceUnmerged show as one free block, in
// both segment modes, in the shared cache and in a private pool.
class SnapshotMergeTest : public AllocatorTest,
                          public ::testing::WithParamInterface<std::tuple<const char*, bool>> {};

TEST_P(SnapshotMergeTest, FreeNeighboursShowAsOneBlock) {
  const auto [mode, in_pool] = GetParam();
  Make({}, mode);
  constexpr MemPoolId kPool{7, 0};
  if (in_pool) {
    ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  }
  std::vector<void*> p;
  for (int i = 0; i < 11; ++i) p.push_back(Alloc(512));
  for (int i = 0; i < 11; ++i) {
    if (i != 5) ASSERT_TRUE(alloc_->Free(p[i]).ok());
  }
  const std::vector<SegmentSnapshot> snap = alloc_->Snapshot();
  const SegmentSnapshot* seg = nullptr;
  for (const SegmentSnapshot& s : snap) {
    for (const BlockSnapshot& b : s.blocks) {
      if (b.address == reinterpret_cast<std::uintptr_t>(p[5])) seg = &s;
    }
  }
  ASSERT_NE(seg, nullptr);
  std::vector<std::string> states;
  for (const BlockSnapshot& b : seg->blocks) states.push_back(b.state);
  EXPECT_THAT(states, ::testing::ElementsAre("inactive", "active_allocated", "inactive"));
  EXPECT_EQ(seg->blocks[0].size, 5u * 512);
  EXPECT_EQ(seg->blocks[0].address, reinterpret_cast<std::uintptr_t>(p[0]));
  std::size_t total = 0;
  for (const BlockSnapshot& b : seg->blocks) total += b.size;
  EXPECT_EQ(total, seg->total_size);
  if (in_pool) {
    EXPECT_EQ(seg->blocks[0].pool, kPool);
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  }
  ASSERT_TRUE(alloc_->Free(p[5]).ok());
  if (in_pool) ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

INSTANTIATE_TEST_SUITE_P(Modes, SnapshotMergeTest,
                         ::testing::Combine(::testing::Values("segments:arena", "segments:classic"),
                                            ::testing::Bool()));

// PyTorch's settings strings (PYTORCH_CUDA_ALLOC_CONF,
// _set_allocator_settings): the shared keys act from the next request on, as
// test_allocator_settings checks through the statistics.
TEST_F(AllocatorTest, PyTorchSettingsRoundFromTheNextRequest) {
  Make({}, "");
  const auto allocated = [&] { return alloc_->GetStats(0)->allocated_bytes[kAllPools].current; };
  const auto requested = [&] { return alloc_->GetStats(0)->requested_bytes[kAllPools].current; };
  const std::size_t n = std::size_t{84} << 10;  // in [64 KiB, 128 KiB)
  const auto grows_by = [&](std::size_t bytes) {
    const auto a = allocated(), r = requested();
    void* p = Alloc(bytes);
    const auto d = allocated() - a;
    EXPECT_EQ(requested() - r, static_cast<std::int64_t>(bytes));  // always what was asked
    EXPECT_TRUE(alloc_->Free(p).ok());
    return static_cast<std::size_t>(d);
  };
  EXPECT_EQ(grows_by(n), n);
  ASSERT_TRUE(alloc_->ApplyPyTorchSettings("roundup_power2_divisions:4").ok());
  EXPECT_EQ(grows_by(n), std::size_t{96} << 10);
  // PyTorch's keys of its own are ignored; a shared key left out goes back.
  ASSERT_TRUE(alloc_->ApplyPyTorchSettings(
                        "expandable_segments:True,garbage_collection_threshold:0.5,"
                        "max_split_size_mb:40,pinned_use_cuda_host_register:True")
                  .ok());
  EXPECT_EQ(grows_by(n), n);
  ASSERT_TRUE(alloc_->ApplyPyTorchSettings("roundup_power2_divisions:[1:8,4:2,8:1]").ok());
  EXPECT_EQ(grows_by(n), std::size_t{88} << 10);
  EXPECT_EQ(grows_by((std::size_t{5} << 20) + 1), std::size_t{6} << 20);  // [4, 8) MiB: 2
  // As PyTorch reads it, ">" covers the last named interval too.
  ASSERT_TRUE(alloc_->ApplyPyTorchSettings("roundup_power2_divisions:[1:8,4:2,>:1]").ok());
  EXPECT_EQ(grows_by((std::size_t{5} << 20) + 1), (std::size_t{5} << 20) + 512);
  // A bad value names the key and changes nothing.
  absl::Status bad = alloc_->ApplyPyTorchSettings("max_split_size_mb:8,roundup_power2_divisions:3");
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), ::testing::HasSubstr("'roundup_power2_divisions'"));
  EXPECT_EQ(grows_by(n), std::size_t{88} << 10);
  EXPECT_EQ(alloc_->config().roundup_power2_divisions, RoundupDivisions());  // as created
  ExpectInvariants();
}

TEST_F(AllocatorTest, PyTorchSettingsLeaveOutASharedKeyAndCmaConfTakesOver) {
  Make({}, "roundup_power2_divisions:2");
  ASSERT_TRUE(alloc_->ApplyPyTorchSettings("roundup_power2_divisions:8").ok());
  const auto a = alloc_->GetStats(0)->allocated_bytes[kAllPools].current;
  void* p = Alloc(std::size_t{84} << 10);
  EXPECT_EQ(alloc_->GetStats(0)->allocated_bytes[kAllPools].current - a, 88 << 10);
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ApplyPyTorchSettings("").ok());
  p = Alloc(std::size_t{84} << 10);  // CMA_ALLOC_CONF's 2: steps of 32 KiB
  EXPECT_EQ(alloc_->GetStats(0)->allocated_bytes[kAllPools].current - a, 96 << 10);
  ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(AllocatorTest, DestructionReturnsEverythingEvenLiveBlocks) {
  Alloc(4096);
  Alloc(30 << 20);
  alloc_.reset();
  EXPECT_EQ(backend_->LiveResources().managed_allocations, 0);
}

TEST_F(AllocatorTest, InvariantsHoldThroughAMixedSequence) {
  std::vector<void*> live;
  for (int i = 0; i < 200; ++i) {
    const std::size_t n = (i * 7919) % (6 << 20) + 1;
    live.push_back(Alloc(n));
    if (i % 3 == 0) {
      ASSERT_TRUE(alloc_->Free(live[i / 2]).ok());
      live[i / 2] = nullptr;
    }
    ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
  }
  for (void* p : live) {
    if (p != nullptr) {
      ASSERT_TRUE(alloc_->Free(p).ok());
    }
  }
  ExpectInvariants();
  EXPECT_EQ(Stats().allocated_bytes[kAllPools].current, 0);
}

}  // namespace
}  // namespace cma
