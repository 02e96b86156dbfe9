// Pools that no capture allocates to (PyTorch's use_mem_pool: contexts begun
// not_a_capture) keep the shared cache's footprint: cma stays active while
// their contexts are open, they grow by arenas of their own whose idle pages
// go back by need, and once a capture allocates to such a pool its free
// pages stay populated for good.
#include <vector>

#include "gtest/gtest.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

constexpr MemPoolId kPool{41, 0};
constexpr std::size_t kMiB = std::size_t{1} << 20;

class MemPoolArenaTest : public MemPoolFixture {
 protected:
  void BeginUseMemPool(StreamFilter filter = nullptr) { BeginNotACapture(kPool, std::move(filter)); }
  std::int64_t Segments() { return Stats().segment[kAllPools].current; }
};

TEST_F(MemPoolArenaTest, ANotACaptureContextLeavesTheAllocatorActive) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginUseMemPool();
  EXPECT_FALSE(alloc_->AllocatingToPool(0));
  void* p = Alloc(8 * kMiB, 0, s1_);
  const std::int64_t calls = UncapturableCalls();
  ASSERT_TRUE(alloc_->Free(p).ok());
  // Refused while a capture may be under way; here they run.
  EXPECT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_GT(UncapturableCalls(), calls);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_F(MemPoolArenaTest, GrowsByOneArenaAndGivesIdlePagesBack) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginUseMemPool();
  // Sizes a classic pool would give a segment each (2 MiB-rounded, > 10 MiB).
  std::vector<void*> live;
  for (std::size_t mib : {11, 13, 17, 23, 29, 31}) live.push_back(Alloc(mib * kMiB, 0, s1_));
  EXPECT_EQ(Segments(), 1) << "a pool of use_mem_pool grows by one arena, not a segment each";
  const std::int64_t full = Reserved();
  for (std::size_t i = 0; i < live.size(); i += 2) ASSERT_TRUE(alloc_->Free(live[i]).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_LE(Reserved(), full - (11 + 17 + 29 - 6) * static_cast<std::int64_t>(kMiB))
      << "the pool's idle pages stayed populated";
  for (std::size_t i = 1; i < live.size(); i += 2) ASSERT_TRUE(alloc_->Free(live[i]).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
  EXPECT_EQ(Segments(), 0) << "a released, empty pool's arena goes back with the cache";
  EXPECT_FALSE(alloc_->GetPoolUseCount(0, kPool).ok()) << "and the pool is forgotten";
}

TEST_F(MemPoolArenaTest, ThePoolsBlocksServeNoOneElse) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginUseMemPool(Only(s1_));
  void* pooled = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(pooled).ok());
  void* shared = Alloc(4 * kMiB, 0, s2_);  // s2 is not routed to the pool
  EXPECT_NE(shared, pooled);
  void* again = Alloc(4 * kMiB, 0, s1_);
  EXPECT_EQ(again, pooled) << "the pool's free block serves the pool";
  ASSERT_TRUE(alloc_->Free(again).ok());
  ASSERT_TRUE(alloc_->Free(shared).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_F(MemPoolArenaTest, OnceCapturedItsFreePagesStayPopulated) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginUseMemPool(Only(s1_));
  void* warm = Alloc(16 * kMiB, 0, s1_);  // the pool's arena, as a warm-up makes it
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  // A capture into the same pool (a context that may be one): quiet.
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  EXPECT_TRUE(alloc_->AllocatingToPool(0));
  void* captured = Alloc(8 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(captured).ok());  // a graph replays into it from now on
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(warm).ok());
  const std::int64_t before = Reserved();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), before) << "a captured pool's free pages were discarded";
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0) << "released, its memory goes back";
}

TEST_F(MemPoolArenaTest, TwoStreamsShareThePoolsPages) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginUseMemPool();
  void* a = Alloc(32 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  // s1 is idle: its free block is adopted by s2 rather than new pages.
  const std::int64_t before = Reserved();
  void* b = Alloc(32 * kMiB, 0, s2_);
  EXPECT_EQ(Reserved(), before);
  EXPECT_EQ(Segments(), 1);
  ASSERT_TRUE(alloc_->Free(b).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_F(MemPoolArenaTest, ClassicModeKeepsSegmentsButStaysActive) {
  Remake("segments:classic");
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginUseMemPool();
  void* p = Alloc(11 * kMiB, 0, s1_);
  void* q = Alloc(13 * kMiB, 0, s1_);
  EXPECT_EQ(Segments(), 2) << "classic pools grow by segments, as PyTorch's";
  EXPECT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

}  // namespace
}  // namespace cma
