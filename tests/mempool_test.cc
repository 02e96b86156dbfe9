// Private pools (allocator/mempool.h) with PyTorch's semantics, on the host
// backend: routing by stream filter, blocks that serve only their pool,
// release into the shared cache, checkPoolLiveAllocations, and a quiet
// allocator (no query, event, sync, placement or discard) while a pool is
// being allocated to, as a CUDA graph capture needs.
#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr MemPoolId kPool{1, 0};
constexpr MemPoolId kOther{2, 0};

using MemPoolTest = MemPoolFixture;

TEST_F(MemPoolTest, APoolsBlocksServeOnlyThatPool) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  void* in_pool = Alloc(4 * kMiB, 0, s1_);
  void* outside = Alloc(4 * kMiB, 0, s2_);  // the filter does not take s2
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  EXPECT_NE(in_pool, outside);
  ASSERT_TRUE(alloc_->Free(in_pool).ok());
  // The shared cache cannot have it, not even on the same stream...
  void* shared = Alloc(4 * kMiB, 0, s1_);
  EXPECT_NE(shared, in_pool);
  // ...but the pool gets it back.
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  void* again = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  EXPECT_EQ(again, in_pool);
  for (void* p : {again, outside, shared}) ASSERT_TRUE(alloc_->Free(p).ok());
  ExpectInvariants();
  // Two references (two begins): two releases dissolve it.
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  EXPECT_EQ(alloc_->ReleasePool(0, kPool).code(), absl::StatusCode::kInvalidArgument);
}

// Once released and empty a pool drains: in arena mode it keeps its own
// segment (never lent to the shared cache, which lives in arenas) and stays
// known until the cache's memory goes back, as PyTorch keeps a released
// pool until its segments are freed; in classic mode too.
TEST_F(MemPoolTest, AReleasedPoolDrainsWithItsSegmentUntilEmptyCache) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());  // a MemPool
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  void* a = Alloc(6 * kMiB, 0, s1_);
  void* b = Alloc(6 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // the context's reference
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // the MemPool's: b still lives
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* other = Alloc(6 * kMiB, 0, s1_);
  EXPECT_NE(other, a);  // still the pool's
  ASSERT_TRUE(alloc_->Free(other).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());  // the last: the pool dissolves
  ExpectInvariants();
  EXPECT_TRUE(alloc_->CheckPoolLiveAllocations(0, kPool, {}).ok());  // known, draining
  void* shared = Alloc(12 * kMiB, 0, s1_);
  EXPECT_NE(shared, a);  // not the pool's old segment
  EXPECT_EQ(Stats().segment[kLargePool].current, 2);  // an arena and the draining segment
  ASSERT_TRUE(alloc_->Free(shared).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment[kAllPools].current, 0);
  EXPECT_FALSE(alloc_->CheckPoolLiveAllocations(0, kPool, {}).ok());  // gone with it
  ExpectInvariants();
  Remake("segments:classic");  // classic: the same, though the shared cache is classic too
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  a = Alloc(6 * kMiB, 0, s1_);
  b = Alloc(6 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  for (void* x : {a, b}) ASSERT_TRUE(alloc_->Free(x).ok());
  EXPECT_TRUE(alloc_->CheckPoolLiveAllocations(0, kPool, {}).ok());  // known, draining
  shared = Alloc(12 * kMiB, 0, s1_);
  EXPECT_NE(shared, a);
  ASSERT_TRUE(alloc_->Free(shared).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment[kAllPools].current, 0);
  EXPECT_FALSE(alloc_->CheckPoolLiveAllocations(0, kPool, {}).ok());
}

// A graph replays on PyTorch's current stream, which cma never hears of, so
// a released graph pool's block may still be written when its tensor is
// freed: it serves no one until the cache's memory goes back after a wait
// for the device, in either mode (a review found classic mode lent it to
// its capture stream at once).
TEST_F(MemPoolTest, AReleasedPoolsBlockIsNotLentWhileAReplayMayStillWriteIt) {
  for (const char* mode : {"segments:arena", "segments:classic"}) {
    SCOPED_TRACE(mode);
    Remake(mode);
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
    void* out = Alloc(kMiB, 0, s1_);  // a graph's output
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
    ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // a replay, on a stream cma never sees
    ASSERT_TRUE(alloc_->Free(out).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // the graph is reset
    for (Stream s : {s1_, s2_}) {
      void* again = Alloc(kMiB, 0, s);
      EXPECT_NE(again, out);
      ASSERT_TRUE(alloc_->Free(again).ok());
    }
    ExpectInvariants();
    ASSERT_TRUE(alloc_->EmptyCache().ok());  // waits, then gives it back
    EXPECT_FALSE(alloc_->CheckPoolLiveAllocations(0, kPool, {}).ok());
    ExpectInvariants();
  }
}

// A released pool that still drains is taken back whole by its id, as
// PyTorch's graph pools are until their segments are freed; the segment is
// counted once, and goes back once, whichever way the pool ends.
TEST_F(MemPoolTest, TakingADrainingPoolsIdAgainTakesItsSegmentBack) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  void* a = Alloc(6 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->SetPoolOptions(0, kPool, PoolOptions{false, true}).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());  // released and empty: it drains
  const std::int64_t segments = Stats().segment[kAllPools].current;
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  EXPECT_EQ(Alloc(6 * kMiB, 0, s1_), a);  // its own again
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  absl::StatusOr<PoolOptions> options = alloc_->GetPoolOptions(0, kPool);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->use_on_oom);  // with its options, as PyTorch's graph pools
  EXPECT_EQ(Stats().segment[kAllPools].current, segments);
  ASSERT_TRUE(alloc_->EmptyCache().ok());  // a live pool's segment stays
  EXPECT_EQ(Stats().segment[kAllPools].current, 1);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment[kAllPools].current, 0);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_FALSE(alloc_->CheckPoolLiveAllocations(0, kPool, {}).ok());
  ExpectInvariants();
}

TEST_F(MemPoolTest, CheckPoolLiveAllocationsComparesTheExactSet) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  void* a = Alloc(kMiB, 0, s1_);
  void* b = Alloc(512, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  void* shared = Alloc(kMiB, 0, s1_);
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, {a, b}));
  EXPECT_FALSE(*alloc_->CheckPoolLiveAllocations(0, kPool, {a}));
  EXPECT_FALSE(*alloc_->CheckPoolLiveAllocations(0, kPool, {a, b, shared}));
  ASSERT_TRUE(alloc_->Free(b).ok());
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, {a}));
  EXPECT_EQ(alloc_->CheckPoolLiveAllocations(0, kOther, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (void* p : {a, shared}) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_F(MemPoolTest, TheLatestContextWhoseFilterTakesTheStreamWins) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kOther, Only(s2_)).ok());
  void* a = Alloc(kMiB, 0, s1_);
  void* b = Alloc(kMiB, 0, s2_);
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, {a}));
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kOther, {b}));
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kOther).ok());
  EXPECT_EQ(alloc_->EndAllocateToPool(0, kOther).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  for (void* p : {a, b}) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kOther).ok());
  ExpectInvariants();
}

TEST_F(MemPoolTest, WhileAPoolIsAllocatedToNothingUncapturableIsCalled) {
  // A warm cache first, then a "capture" on s1.
  void* warm = Alloc(8 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(warm).ok());
  backend_->SetCapturing(s1_, true);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  void* a = Alloc(4 * kMiB, 0, s1_);       // from the warm cache
  void* big = Alloc(64 * kMiB, 0, s1_);    // new pages: populated by first touch
  void* c = Alloc(kMiB, 0, s2_);           // another stream, shared cache
  ASSERT_TRUE(alloc_->RecordStream(a, s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());       // needs an event on s2: deferred
  ASSERT_TRUE(alloc_->Free(c).ok());
  EXPECT_EQ(UncapturableCalls(), before);
  EXPECT_THAT(alloc_->EmptyCache().message(), HasSubstr("is being allocated to"));
  EXPECT_EQ(alloc_->Sleep(0, s2_).status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectInvariants();
  backend_->SetCapturing(s1_, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  // Now the deferred free records its event on s2; a is the pool's again
  // only once s2's work is done.
  EXPECT_GT(backend_->CallCount("RecordEvent"), 0);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  void* busy = Alloc(4 * kMiB, 0, s1_);
  EXPECT_NE(busy, a);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  // Completed events are looked at only outside pool contexts (as PyTorch
  // processes events only when no capture is under way).
  ASSERT_TRUE(alloc_->Free(Alloc(512, 0, s2_)).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  void* reused = Alloc(4 * kMiB, 0, s1_);
  EXPECT_EQ(reused, a);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  for (void* p : {big, busy, reused}) ASSERT_TRUE(alloc_->Free(p).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
}

// A graph replays into the blocks its capture freed, so a live pool's free
// blocks are neither discarded nor released, whatever asks.
TEST_F(MemPoolTest, ALivePoolsFreeBlocksSurviveEmptyCacheAndTheBudget) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  void* temp = Alloc(16 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(temp).ok());  // freed during "capture"
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(alloc_->SetMemoryFraction(1.0 / 1024, 0).ok());
  ASSERT_TRUE(alloc_->SetMemoryFraction(1.0, 0).ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(16 * kMiB));
  for (const PlacementRecord& r : backend_->Records()) {
    if (r.op != PlacementRecord::Op::kDiscard) continue;
    const auto lo = reinterpret_cast<std::uintptr_t>(r.ptr);
    const auto t = reinterpret_cast<std::uintptr_t>(temp);
    EXPECT_FALSE(lo < t + 16 * kMiB && t < lo + r.bytes) << "discarded the pool's block";
  }
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // gone: the cache may release it now
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  ExpectInvariants();
}

TEST_F(MemPoolTest, ClassicSegmentsKeepPoolsApartToo) {
  Remake("segments:classic");
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  void* a = Alloc(700, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(700, 0, s1_);
  EXPECT_NE(a, b);
  ASSERT_TRUE(alloc_->Free(b).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
  // Dissolved: the pool's segment is the shared cache's now, until
  // empty_cache gives it back whole.
  const std::int64_t segments = Stats().segment[kAllPools].current;
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment[kAllPools].current, segments - 2);
  ExpectInvariants();
}

TEST_F(MemPoolTest, BadCallsAreClearErrorsAndChangeNothing) {
  const std::string before = Fingerprint(*alloc_);
  EXPECT_EQ(alloc_->BeginAllocateToPool(3, kPool, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(alloc_->EndAllocateToPool(0, kPool).message(), HasSubstr("not being allocated to"));
  EXPECT_THAT(alloc_->ReleasePool(0, kPool).message(), HasSubstr("holds no reference"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
}

}  // namespace
}  // namespace cma

