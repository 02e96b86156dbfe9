// A private pool grows by segments of its own, as PyTorch's pools do, so
// that PyTorch's statistics (segment.*, reserved_bytes.*) tell the story
// native's tell: the sequence and expected figures of PyTorch's
// test_graph_memory_stats_and_use_result_after_destroy_graph (test_cuda.py),
// replayed on the host backend, in arena mode (the default) and classic.
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kSmallSize = kMiB;
constexpr std::size_t kSmallBuffer = 2 * kMiB;
constexpr std::size_t kLargeBuffer = 20 * kMiB;
constexpr std::size_t kMinLargeAlloc = 10 * kMiB;
constexpr std::size_t kRoundLarge = 2 * kMiB;

struct Case {
  std::size_t bytes;
  std::int64_t segments;            // new segments the capture makes
  std::int64_t reserved;            // and their bytes
  std::int64_t reserved_after_del;  // the segment the result still holds
  StatPool pool;
};

std::size_t RoundedLarge(std::size_t n) { return (n + kRoundLarge - 1) / kRoundLarge * kRoundLarge; }

const Case kCases[] = {
    {512, 1, kSmallBuffer, kSmallBuffer, kSmallPool},
    {kSmallSize, 2, 2 * kSmallBuffer, kSmallBuffer, kSmallPool},
    {kSmallSize + 512, 1, kLargeBuffer, kLargeBuffer, kLargePool},
    {kMinLargeAlloc - 512, 2, 2 * kLargeBuffer, kLargeBuffer, kLargePool},
    {kMinLargeAlloc + 512, 3, 3 * static_cast<std::int64_t>(RoundedLarge(kMinLargeAlloc + 512)),
     static_cast<std::int64_t>(RoundedLarge(kMinLargeAlloc + 512)), kLargePool},
};

class PoolSegmentsTest : public MemPoolFixture,
                         public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override { Remake(GetParam()); }
};

TEST_P(PoolSegmentsTest, PyTorchsGraphMemoryStatsCasesGiveNativesFigures) {
  const Stream s = s1_;
  std::uint64_t graph = 1;
  for (const Case& c : kCases) {
    SCOPED_TRACE(::testing::Message() << "request of " << c.bytes << " bytes");
    const MemPoolId pool{graph++, 0};
    void* a = Alloc(c.bytes, 0, s);  // the input, in the shared cache
    const DeviceStats pre = Stats();
    // capture_begin: the generator's seed and offset holders, then the
    // graph's pool (a context on the capturing stream).
    std::vector<void*> holders = {Alloc(8, 0, s), Alloc(8, 0, s)};
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s)).ok());
    void* b = Alloc(c.bytes, 0, s);  // b = a.clone()
    for (int i = 0; i < 5; ++i) {    // b = b.clone() + 1
      void* t = Alloc(c.bytes, 0, s);
      void* y = Alloc(c.bytes, 0, s);
      ASSERT_TRUE(alloc_->Free(t).ok());
      ASSERT_TRUE(alloc_->Free(b).ok());
      b = y;
    }
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
    const DeviceStats post = Stats();
    auto delta = [&](const StatArray& after, const StatArray& before) {
      return after[c.pool].current - before[c.pool].current;
    };
    EXPECT_EQ(delta(post.segment, pre.segment), c.segments);
    EXPECT_EQ(delta(post.reserved_bytes, pre.reserved_bytes), c.reserved);
    ExpectInvariants();
    ASSERT_TRUE(alloc_->EmptyCache().ok());  // a live graph's pool keeps its segments
    EXPECT_EQ(delta(Stats().segment, pre.segment), c.segments);
    EXPECT_EQ(delta(Stats().reserved_bytes, pre.reserved_bytes), c.reserved);

    // del g: the pool's reference and the holders go; b outlives its graph.
    ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
    for (void* h : holders) ASSERT_TRUE(alloc_->Free(h).ok());
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    const DeviceStats after_del = Stats();
    EXPECT_EQ(delta(after_del.segment, pre.segment), 1);
    EXPECT_EQ(delta(after_del.reserved_bytes, pre.reserved_bytes), c.reserved_after_del);
    EXPECT_EQ(delta(after_del.active, pre.active), 1);
    EXPECT_EQ(delta(after_del.active_bytes, pre.active_bytes),
              static_cast<std::int64_t>((c.bytes + 511) / 512 * 512));
    ExpectInvariants();

    // del a, b; empty_cache: nothing of the graph is left.
    ASSERT_TRUE(alloc_->Free(a).ok());
    ASSERT_TRUE(alloc_->Free(b).ok());
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
    ExpectInvariants();
  }
}

// While quiet no cached memory may be given back (a discard or a free would
// break a capture), so a pool's new segment must fit the budget as it is:
// refused, naming the way out, and it fits once empty_cache made room.
TEST_P(PoolSegmentsTest, APoolSegmentNeverExceedsTheBudget) {
  ASSERT_TRUE(alloc_->SetMemoryFraction(0.5, 0).ok());  // a budget of 512 MiB
  void* big = Alloc(400 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(big).ok());  // 400 MiB cached
  const MemPoolId pool{7, 0};
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s2_)).ok());
  const std::int64_t uncapturable = UncapturableCalls();
  absl::StatusOr<void*> p = alloc_->Allocate(300 * kMiB, 0, s2_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("empty_cache"));
  EXPECT_EQ(UncapturableCalls(), uncapturable);  // nothing given back while quiet
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  EXPECT_LE(Stats().reserved_bytes[kAllPools].current, Stats().managed_budget_bytes);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s2_)).ok());
  void* q = Alloc(300 * kMiB, 0, s2_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());  // the context's reference
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
}

// Beyond the budget, a pool's growth is refused, naming the budget.
TEST_P(PoolSegmentsTest, APoolSegmentBeyondTheBudgetIsRefused) {
  ASSERT_TRUE(alloc_->SetMemoryFraction(0.5, 0).ok());
  void* held = Alloc(400 * kMiB, 0, s1_);  // in use
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, MemPoolId{8, 0}, nullptr).ok());
  absl::StatusOr<void*> p = alloc_->Allocate(300 * kMiB, 0, s1_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("budget"));
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, MemPoolId{8, 0}).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, MemPoolId{8, 0}).ok());
  ASSERT_TRUE(alloc_->Free(held).ok());
  ExpectInvariants();
}

// A released pool's wholly free segment goes back whenever cached memory
// does: with a Sleep (the device then holds nothing of the allocator's)
// and with a lower budget, in arena mode as in classic.
class ReleasedPoolSegmentTest : public PoolSegmentsTest {
 protected:
  void* held_ = nullptr;
  // A released pool whose 20 MiB segment became wholly free after the
  // release, and whose 2 MiB one still holds a block (so it lives on).
  void MakeReleasedPoolSegment() {
    const MemPoolId pool{9, 0};
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
    void* p = Alloc(4 * kMiB, 0, s1_);
    held_ = Alloc(4096, 0, s1_);
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
    ASSERT_TRUE(alloc_->Free(p).ok());  // wholly free after the release: nothing gave it back
    ASSERT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(22 * kMiB));
  }
};

TEST_P(ReleasedPoolSegmentTest, SleepGivesItBack) {
  MakeReleasedPoolSegment();
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(2 * kMiB));
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  ASSERT_TRUE(alloc_->Free(held_).ok());
}

TEST_P(ReleasedPoolSegmentTest, ALowerBudgetGivesItBack) {
  MakeReleasedPoolSegment();
  ASSERT_TRUE(alloc_->SetMemoryFraction(8.0 / 1024, 0).ok());  // 8 MiB
  EXPECT_LE(Stats().reserved_bytes[kAllPools].current, Stats().managed_budget_bytes);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(held_).ok());
}

// A dissolved pool's segments stay cached until cached memory is given
// back, never at the release itself: a block freed during another graph's
// capture may still be written by that graph's replays (PyTorch's
// test_graph_capture_reset_recapture).
TEST_P(PoolSegmentsTest, ADissolvedPoolsSegmentsStayUntilEmptyCache) {
  const MemPoolId pool{10, 0}, next{11, 0};
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
  void* b = Alloc(4096, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());  // g.reset(): b outlives its pool
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, next, Only(s1_)).ok());  // the recapture
  ASSERT_TRUE(alloc_->Free(b).ok());  // the graph being captured still writes b's memory
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, next).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, next).ok());
  const std::int64_t frees = backend_->CallCount("FreeManaged");
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(2 * kMiB));
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_GT(backend_->CallCount("FreeManaged"), frees);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, ReleasedPoolSegmentTest,
                         ::testing::Values("", "segments:classic"));

// An out-of-memory retry that gives back classic segments for an arena's
// pages counts device memory only: a cached host-tier segment (the
// oversubscription's) is neither counted nor freed.
class PoolSegmentsHostTierTest : public AllocatorTest {
 protected:
  void SetUp() override {
    Make({.device_count = 1, .device_capacity = 64 * kMiB, .manual_completion = true,
          .host_available = std::size_t{4} << 30},
         "oversubscribe:1,device_headroom:8M,managed_budget:200M");  // the device's part: 56 MiB
    s1_ = *backend_->CreateStream(0);
    s2_ = *backend_->CreateStream(0);
  }
  void TearDown() override {
    for (Stream s : {s1_, s2_}) ASSERT_TRUE(backend_->CompleteWork(s).ok());
    AllocatorTest::TearDown();
  }
  Stream s1_ = 0, s2_ = 0;
};

TEST_F(PoolSegmentsHostTierTest, AFreeHostSegmentDoesNotCountAsTheDevicesRoom) {
  const MemPoolId pool{3, 0};
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, [this](Stream s) { return s == s1_; }).ok());
  void* p = Alloc(512 * 1024, 0, s1_);  // a 2 MiB segment of the pool's
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  void* keep = Alloc(4096, 0, s2_);  // a shared allocation, so the release syncs nothing odd
  ASSERT_TRUE(alloc_->Free(keep).ok());
  ASSERT_TRUE(alloc_->SetHostRouting(0, true).ok());
  void* h = Alloc(32 * kMiB, 0, s2_);
  ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
  ASSERT_TRUE(*alloc_->PlacedOnHost(h));
  ASSERT_TRUE(alloc_->Free(h).ok());  // a cached host-tier segment
  ASSERT_TRUE(alloc_->Free(p).ok());  // the pool's segment: wholly free, the pool referenced
  const std::int64_t host_before = Stats().host_resident_bytes[kAllPools].current;
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());  // the context's reference: now released
  void* big = Alloc(54 * kMiB, 0, s1_);
  EXPECT_FALSE(*alloc_->PlacedOnHost(big)) << "spilled to the host";
  EXPECT_EQ(Stats().host_resident_bytes[kAllPools].current, host_before) << "host cache freed";
  ASSERT_TRUE(alloc_->Free(big).ok());
  ExpectInvariants();
}

INSTANTIATE_TEST_SUITE_P(Modes, PoolSegmentsTest,
                         ::testing::Values("", "segments:classic"));

}  // namespace
}  // namespace cma
