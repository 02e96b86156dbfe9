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

// Past the budget while quiet, a pool's segment borrows the room of idle
// arena pages (no discard may be queued while a capture may be under way);
// they are discarded when the context ends, and the budget holds again.
TEST_P(PoolSegmentsTest, APoolSegmentBorrowsIdlePagesUntilTheContextEnds) {
  if (std::string(GetParam()) == "segments:classic") GTEST_SKIP() << "arenas only";
  ASSERT_TRUE(alloc_->SetMemoryFraction(0.5, 0).ok());  // a budget of 512 MiB
  void* big = Alloc(400 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(big).ok());  // 400 MiB of idle populated pages
  const std::int64_t budget = Stats().managed_budget_bytes;
  ASSERT_EQ(budget, static_cast<std::int64_t>(512 * kMiB));
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, MemPoolId{7, 0}, nullptr).ok());
  const std::int64_t uncapturable = UncapturableCalls();
  void* p = Alloc(300 * kMiB, 0, s1_);
  EXPECT_EQ(UncapturableCalls(), uncapturable);  // no discard while quiet
  EXPECT_GT(Stats().reserved_bytes[kAllPools].current, budget);  // borrowed for now
  const std::int64_t discards = backend_->CallCount("DiscardBatch");
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, MemPoolId{7, 0}).ok());
  EXPECT_GT(backend_->CallCount("DiscardBatch"), discards);
  EXPECT_LE(Stats().reserved_bytes[kAllPools].current, budget);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, MemPoolId{7, 0}).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
}

// Beyond what idle pages can lend, a pool's growth is refused, naming the
// budget.
TEST_P(PoolSegmentsTest, APoolSegmentBeyondTheBudgetIsRefused) {
  ASSERT_TRUE(alloc_->SetMemoryFraction(0.5, 0).ok());
  void* held = Alloc(400 * kMiB, 0, s1_);  // in use: nothing to lend
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, MemPoolId{8, 0}, nullptr).ok());
  absl::StatusOr<void*> p = alloc_->Allocate(300 * kMiB, 0, s1_);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(p.status().message()), ::testing::HasSubstr("budget"));
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, MemPoolId{8, 0}).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, MemPoolId{8, 0}).ok());
  ASSERT_TRUE(alloc_->Free(held).ok());
  ExpectInvariants();
}

INSTANTIATE_TEST_SUITE_P(Modes, PoolSegmentsTest,
                         ::testing::Values("", "segments:classic"));

}  // namespace
}  // namespace cma
