// Review of issue 50 (not-a-capture pool contexts, pools that grow by
// arenas): each test is named after the bug it reproduces.
#include <vector>

#include "gtest/gtest.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

constexpr MemPoolId kPool{51, 0};
constexpr std::size_t kMiB = std::size_t{1} << 20;

using MemPoolArenaReviewTest = MemPoolFixture;

// A capture's context with a not-a-capture context of the same pool nested
// inside it (torch.cuda.graph(g, pool=mempool.id) and, inside, a
// use_mem_pool(mempool) entered on a side stream that is not capturing yet).
// EndAllocateToPool erases the pool's FIRST context (the capture's) but the
// capture is still under way: the allocator must stay quiet until the
// capture's own end.
TEST_F(MemPoolArenaReviewTest, EndingANestedNotACaptureContextEndsTheCapturesQuiet) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());  // the capture
  BeginNotACapture(kPool, Only(s2_));                                   // nested use_mem_pool
  ASSERT_TRUE(alloc_->AllocatingToPool(0));
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());  // the inner context's end
  EXPECT_TRUE(alloc_->AllocatingToPool(0))
      << "the capture's context is still open, but the allocator is no longer quiet";
  // What remains routes as the inner (not-a-capture) context, and the
  // capture's stream now gets population, events and the like.
  const std::int64_t calls = UncapturableCalls();
  void* p = Alloc(8 * kMiB, 0, s2_);
  void* q = Alloc(8 * kMiB, 0, s1_);
  EXPECT_EQ(UncapturableCalls(), calls) << "a call that breaks the capture was made";
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());  // the capture's end
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// SGLang's breakable CUDA graph (torch >= 2.8): capture_begin opens the
// capture's context; at a graph break the capture segment ends, the pool's
// context is ended (_cuda_endAllocateToPool), an eager op runs, and the
// pool is resumed with _cuda_beginAllocateCurrentThreadToPool BEFORE the
// next capture segment begins (raw cudaStreamBeginCapture). cma.torch's
// glue flags that thread context not-a-capture (its filter accepts the
// current stream, which is not capturing at that moment), so the rest of
// the capture runs with the allocator active. The pool has already hosted
// a capture (`captured`): a not-a-capture context of a captured pool should
// be quiet.
TEST_F(MemPoolArenaReviewTest, AThreadContextResumedBetweenCaptureSegmentsIsNotQuiet) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());  // capture_begin
  void* seg1 = Alloc(8 * kMiB, 0, s1_);                                 // first segment
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());  // _pause_pool_allocation
  void* eager = Alloc(4 * kMiB, 0, s1_);                  // the break's eager op
  BeginNotACapture(kPool);  // _resume_pool_allocation, as the glue flags it
  backend_->SetCapturing(s1_, true);  // _begin_capture_segment
  const std::int64_t calls = UncapturableCalls();
  void* seg2 = Alloc(8 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(seg2).ok());
  EXPECT_EQ(UncapturableCalls(), calls) << "a call that breaks the capture was made";
  backend_->SetCapturing(s1_, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());  // capture_end
  ASSERT_TRUE(alloc_->Free(seg1).ok());
  ASSERT_TRUE(alloc_->Free(eager).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// cudagraph trees: the warm-up runs in the graph pool under
// _use_cuda_memory_pool_manager (a thread context: not-a-capture), so the
// pool grows by an arena; the recording then captures into it, and from
// then on the arena's free pages are pinned. Once the graph is gone and the
// pool released and wholly free, PyTorch gives such a pool's memory back
// on out-of-memory (and a Sleep, or a lower budget, gives a released
// pool's classic segments back). The arena's pinned pages are neither
// discarded (PoolPagesPinned) nor released (classic_only): the shared
// cache runs out of memory although nothing but a dead pool holds it.
TEST_F(MemPoolArenaReviewTest, AReleasedCapturedPoolsArenaIsNeverGivenBackByNeed) {
  ASSERT_TRUE(alloc_->SetMemoryFraction(0.5, 0).ok());  // a budget of 512 MiB
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginNotACapture(kPool);  // the warm-up
  void* warm = Alloc(300 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(warm).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());  // the recording
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // the graph's reference
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // the pool's own: released, wholly free
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_GE(Reserved(), static_cast<std::int64_t>(300 * kMiB));
  absl::StatusOr<void*> p = alloc_->Allocate(400 * kMiB, 0, s2_);
  EXPECT_TRUE(p.ok()) << "a released, wholly free pool's memory was not given back: "
                      << p.status();
  if (p.ok()) {
    ASSERT_TRUE(alloc_->Free(*p).ok());
  }
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
}

TEST_F(MemPoolArenaReviewTest, AReleasedCapturedPoolsArenaOutlivesASleep) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginNotACapture(kPool);
  void* warm = Alloc(64 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(warm).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_EQ(Reserved(), 0) << "a Sleep left a released pool's memory on the device";
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
}


// A captured pool's arena pins its idle pages, yet they still count in
// idle_pages_, which every room check takes as discardable:
// CheckRoomToBringBack (the check pass of a BringBack over several devices)
// promises room that MakeRoomToBringBack then cannot make. BringBack checks
// every device before any moves ("changes nothing if one fails"); here
// device 0's allocation comes back and the call fails on device 1.
TEST_F(MemPoolArenaReviewTest, PinnedPoolPagesCountAsIdleSoBringBackMovesHalfABatch) {
  Remake("", 2);
  const Stream d1 = *backend_->CreateStream(1);
  ASSERT_TRUE(alloc_->SetMemoryFraction(0.5, 1).ok());  // device 1: 512 MiB
  void* on0 = Alloc(100 * kMiB, 0, s1_);
  void* on1 = Alloc(200 * kMiB, 1, d1);
  ASSERT_TRUE(alloc_->SendAway({on0}, s1_).ok());
  ASSERT_TRUE(alloc_->SendAway({on1}, d1).ok());
  // Device 1's pool: a warm-up (not a capture) grows it by an arena, then a
  // capture pins its 400 MiB of idle pages.
  PoolContextOptions not_a_capture;
  not_a_capture.not_a_capture = true;
  ASSERT_TRUE(alloc_->BeginAllocateToPool(1, kPool, nullptr, not_a_capture).ok());
  void* warm = Alloc(400 * kMiB, 1, d1);
  ASSERT_TRUE(alloc_->Free(warm).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(1, kPool).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(1, kPool, Only(d1)).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(1, kPool).ok());
  const std::int64_t away0 = Stats(0).away_bytes[kAllPools].current;
  ASSERT_GT(away0, 0);
  absl::Status s = alloc_->BringBack({on0, on1}, kDefaultStream);
  EXPECT_FALSE(s.ok()) << "device 1 cannot hold it: only pinned pages are idle";
  EXPECT_EQ(Stats(0).away_bytes[kAllPools].current, away0)
      << "a failed BringBack moved device 0's allocation back: " << s;
  ASSERT_TRUE(backend_->CompleteWork(d1).ok());
  ASSERT_TRUE(alloc_->Free(on0).ok());
  ASSERT_TRUE(alloc_->Free(on1).ok());
  ASSERT_TRUE(alloc_->ReleasePool(1, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(1, kPool).ok());
  ASSERT_TRUE(backend_->CompleteWork(d1).ok());
}

// Probe (passes: recorded as sound): an arena pool captured later, lookups
// switching kinds, checkpoints, use_on_oom lending and no_split toggled.
TEST_F(MemPoolArenaReviewTest, SoundProbeArenaPoolThenCapturedKindsCheckpointsLending) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  BeginNotACapture(kPool);
  std::vector<void*> live;
  for (std::size_t n : {std::size_t{512}, std::size_t{4096}, 3 * kMiB, std::size_t{700000}, 12 * kMiB})
    live.push_back(Alloc(n, 0, s1_));
  ASSERT_TRUE(alloc_->Free(live[1]).ok());
  ASSERT_TRUE(alloc_->Free(live[3]).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  absl::StatusOr<PoolCheckpoint> cp = alloc_->TakePoolCheckpoint(0, kPool);
  ASSERT_TRUE(cp.ok()) << cp.status();
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());  // captured now
  void* small = Alloc(4096, 0, s1_);
  void* large = Alloc(2 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(small).ok());
  ASSERT_TRUE(alloc_->Free(large).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ExpectInvariants();
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(*cp);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectInvariants();
  ASSERT_TRUE(alloc_->SetPoolOptions(0, kPool, PoolOptions{true, true}).ok());
  BeginNotACapture(kPool);
  void* whole = Alloc(4096, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(whole).ok());
  for (const PoolAllocation& a : r->created) ASSERT_TRUE(alloc_->Free(a.ptr).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->EmptyPoolCache(0, kPool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Reserved(), 0);
}

}  // namespace
}  // namespace cma
