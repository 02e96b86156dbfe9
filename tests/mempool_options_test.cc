// Private pools grow by segments of their own, and PyTorch's
// MemPool(no_split=True, use_on_oom=True) (allocator/mempool.h PoolOptions),
// on the host backend.
#include <cstdint>

#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr MemPoolId kPool{1, 0};

class MemPoolOptionsTest : public MemPoolFixture {
 protected:
  // The snapshot's block at `p`.
  BlockSnapshot BlockAt(void* p) {
    for (const SegmentSnapshot& s : alloc_->Snapshot()) {
      for (const BlockSnapshot& b : s.blocks) {
        if (b.address == reinterpret_cast<std::uintptr_t>(p)) return b;
      }
    }
    ADD_FAILURE() << "no block at " << p;
    return {};
  }
  // Creates kPool and sets its options, as PyTorch's MemPool(no_split=,
  // use_on_oom=) does.
  absl::Status PoolWith(PoolOptions options) {
    absl::Status created = alloc_->CreateOrIncrefPool(0, kPool);
    if (!created.ok()) return created;
    return alloc_->SetPoolOptions(0, kPool, options);
  }
  void* InPool(std::size_t bytes, Stream s) {
    EXPECT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
    void* p = Alloc(bytes, 0, s);
    EXPECT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
    EXPECT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // the context's reference
    return p;
  }
};

// A pool grows by a segment of its own of the request's segment size (2 MiB
// for a small request), as PyTorch's pools do: the shared cache's blocks
// stay together, the segment's rest serves the pool, and once the pool is
// released and empty the segment stays the pool's (it drains) until
// empty_cache gives it back whole.
TEST_F(MemPoolOptionsTest, APoolTakesASegmentOfItsOwn) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  void* a = Alloc(kMiB, 0, s1_);
  const std::int64_t segments = Stats().segment[kAllPools].current;
  void* p = InPool(kMiB, s1_);
  void* b = Alloc(kMiB, 0, s1_);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + kMiB);  // the shared run goes on
  void* q = InPool(kMiB, s1_);  // the segment's rest
  EXPECT_EQ(static_cast<char*>(q), static_cast<char*>(p) + kMiB);
  EXPECT_EQ(BlockAt(p).pool, kPool);
  EXPECT_EQ(Stats().segment[kSmallPool].current, 1);  // the pool's, a small one
  EXPECT_EQ(Stats().segment[kAllPools].current, segments + 1);
  std::int64_t pool_segment_bytes = 0;
  for (const SegmentSnapshot& s : alloc_->Snapshot()) {
    if (s.address == reinterpret_cast<std::uintptr_t>(p)) pool_segment_bytes = s.total_size;
  }
  EXPECT_EQ(pool_segment_bytes, static_cast<std::int64_t>(2 * kMiB));
  ExpectInvariants();
  for (void* x : {a, b, p, q}) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // released and empty: it drains
  EXPECT_EQ(BlockAt(p).pool, kPool);
  void* shared = Alloc(kMiB, 0, s1_);
  const bool in_pool_segment = static_cast<char*>(shared) >= static_cast<char*>(p) &&
                               static_cast<char*>(shared) < static_cast<char*>(p) + 2 * kMiB;
  EXPECT_FALSE(in_pool_segment);  // the shared cache does not take it
  ASSERT_TRUE(alloc_->Free(shared).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().segment[kSmallPool].current, 0);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
}

// no_split: each allocation is a whole segment of its own of the request's
// segment size (a 4 MiB request gets a 20 MiB block, as PyTorch's 20 MiB
// segment), is reused whole, and is never split: once the pool is gone no
// free block is left split.
TEST_F(MemPoolOptionsTest, NoSplitHandsOutWholeSegmentsAndReusesThemWhole) {
  ASSERT_TRUE(PoolWith({.no_split = true}).ok());
  void* a = InPool(4 * kMiB, s1_);
  void* b = InPool(4 * kMiB, s1_);
  EXPECT_EQ(BlockAt(a).size, 20 * kMiB);
  EXPECT_EQ(BlockAt(b).size, 20 * kMiB);
  EXPECT_EQ(BlockAt(a).requested, 4 * kMiB);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
  ExpectInvariants();  // two free blocks of one stream and pool, each a whole segment
  EXPECT_EQ(BlockAt(a).size, 20 * kMiB);
  void* c = InPool(3 * kMiB, s1_);  // a cached 20 MiB segment (its segment size too) serves whole
  EXPECT_TRUE(c == a || c == b);
  EXPECT_EQ(BlockAt(c).size, 20 * kMiB);
  void* d = InPool(30 * kMiB, s1_);  // too big for either: a segment of its own
  EXPECT_EQ(BlockAt(d).size, 30 * kMiB);
  for (void* x : {c, d}) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
  const std::int64_t split = alloc_->GetStats(0)->inactive_split[kAllPools].current;
  EXPECT_EQ(split, 0);  // every segment the pool had is still one whole block
}

// use_on_oom: when the device is full, a live pool's free block serves an
// allocation from elsewhere, as that pool's; a released pool's never does.
TEST_F(MemPoolOptionsTest, UseOnOomLendsALivePoolsFreeBlockAndOnlyThen) {
  ASSERT_TRUE(PoolWith({.use_on_oom = true}).ok());
  void* cached = InPool(200 * kMiB, s1_);
  ASSERT_TRUE(alloc_->Free(cached).ok());  // the pool's, populated, kept
  void* big = Alloc(800 * kMiB, 0, s1_);  // the 1 GiB device is now nearly full
  absl::StatusOr<void*> lent = alloc_->Allocate(100 * kMiB, 0, s1_);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(*lent, cached);
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, {*lent}));  // the pool's
  ASSERT_TRUE(alloc_->Free(*lent).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->SetPoolOptions(0, kPool, {.use_on_oom = false}).ok());
  EXPECT_EQ(alloc_->Allocate(100 * kMiB, 0, s1_).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(alloc_->Free(big).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

TEST_F(MemPoolOptionsTest, UseOnOomSkipsAReleasedPool) {
  ASSERT_TRUE(PoolWith({.use_on_oom = true}).ok());
  void* held = InPool(100 * kMiB, s1_);  // keeps the pool alive after its release
  void* cached = InPool(200 * kMiB, s1_);
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // no reference left (PyTorch: deleted)
  ASSERT_TRUE(alloc_->Free(cached).ok());  // wholly free after the release, still cached
  void* big = Alloc(700 * kMiB, 0, s1_);
  // Not lent: the released pool's wholly free segment is given back
  // instead, as PyTorch frees a released pool's cached segments.
  const std::int64_t frees = Stats().num_device_free;
  absl::StatusOr<void*> p = alloc_->Allocate(100 * kMiB, 0, s1_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Stats().num_device_free, frees + 1);
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, {held}));
  for (void* x : {held, big, *p}) ASSERT_TRUE(alloc_->Free(x).ok());
  ExpectInvariants();
}

// An allocation routed to a pool (a capture into another pool) is never lent
// a use_on_oom pool's block: freed, it would go back to the lender while the
// borrower's graph replays into it (PyTorch: "just oom"). (Review.)
TEST_F(MemPoolOptionsTest, UseOnOomLendsNothingToAnotherPoolsCapture) {
  constexpr MemPoolId kOther{2, 0};
  ASSERT_TRUE(PoolWith({.use_on_oom = true}).ok());
  void* cached = InPool(200 * kMiB, s1_);
  ASSERT_TRUE(alloc_->Free(cached).ok());
  void* big = Alloc(800 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kOther, Only(s1_)).ok());
  const std::int64_t calls = UncapturableCalls();
  absl::StatusOr<void*> got = alloc_->Allocate(100 * kMiB, 0, s1_);
  EXPECT_EQ(UncapturableCalls(), calls);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kOther).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kOther).ok());
  // A stream no context takes still borrows, while quiet too, with no call.
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kOther, Only(s2_)).ok());
  absl::StatusOr<void*> lent = alloc_->Allocate(100 * kMiB, 0, s1_);
  EXPECT_EQ(UncapturableCalls(), calls);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(*lent, cached);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kOther).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kOther).ok());
  for (void* x : {*lent, big}) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

// no_split never takes more than the request's segment size: a segment of
// its own of that size, not a whole cached shared segment (classic
// segments). (Review.)
TEST_F(MemPoolOptionsTest, NoSplitTakesASegmentOfTheRequestsSizeNotACachedSharedOne) {
  Remake("segments:classic");
  void* shared = Alloc(500 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(shared).ok());  // a 500 MiB cached shared segment
  ASSERT_TRUE(PoolWith({.no_split = true}).ok());
  void* p = InPool(12 * kMiB, s1_);
  EXPECT_EQ(BlockAt(p).size, 12 * kMiB);  // the request's segment size, as PyTorch's
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

// Nor a far larger free segment of the pool's own for a tiny request: a new
// segment of the tiny request's segment size (2 MiB) serves it. (Review.)
TEST_F(MemPoolOptionsTest, NoSplitServesATinyRequestFromASegmentOfItsSizeNotALargeFreeOne) {
  ASSERT_TRUE(PoolWith({.no_split = true}).ok());
  void* a = InPool(300 * kMiB, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* t = InPool(512, s1_);
  EXPECT_NE(t, a);
  EXPECT_EQ(BlockAt(t).size, 2 * kMiB);
  for (void* x : {t}) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

TEST_F(MemPoolOptionsTest, OptionsForAPoolWithoutAReferenceAreRefused) {
  absl::Status s = alloc_->SetPoolOptions(0, kPool, {.no_split = true});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("does not exist"));
  EXPECT_EQ(alloc_->SetPoolOptions(7, kPool, {}).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cma
