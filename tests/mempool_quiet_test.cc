// While a private pool is being allocated to (a CUDA graph capture may be
// under way) the allocator makes no call that would break the capture, and
// a refused call changes nothing. Each test is a reproducer from an
// adversarial review of the private pools, named after the rule it protects;
// each failed on the code before its fix.
#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr MemPoolId kPool{1, 0};

using PoolQuietTest = MemPoolFixture;

// Review bug 1 (fixed): freeing a block whose pages a Sleep discarded, while a pool is being
// allocated to, records an event and makes a stream wait (OrderAfter in
// BecameFree), which breaks a capture.
TEST_F(PoolQuietTest, FreeingASleptBlockWaitsForTheContextsEnd) {
  void* a = Alloc(8 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->SetDisposable(a, true).ok());
  ASSERT_TRUE(alloc_->Sleep(0, s2_).ok());
  backend_->SetCapturing(s1_, true);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  const std::int64_t rec = backend_->CallCount("RecordEvent");
  const std::int64_t wait = backend_->CallCount("StreamWaitEvent");
  ASSERT_TRUE(alloc_->Free(a).ok());
  EXPECT_EQ(backend_->CallCount("RecordEvent"), rec);
  EXPECT_EQ(backend_->CallCount("StreamWaitEvent"), wait);
  EXPECT_EQ(UncapturableCalls(), before) << "free made a capture-breaking call while quiet";
  backend_->SetCapturing(s1_, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

// Review bug 2 (fixed): Move (and SetHints) are not refused while quiet: they prefetch/advise
// during a capture.
TEST_F(PoolQuietTest, MoveIsRefusedWhileQuiet) {
  void* a = Alloc(8 * kMiB, 0, s1_);
  backend_->SetCapturing(s1_, true);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  absl::Status s = alloc_->Move(a, Location::Host(), s1_);
  EXPECT_EQ(UncapturableCalls(), before) << "Move made a placement call while quiet: " << s;
  backend_->SetCapturing(s1_, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(PoolQuietTest, SetHintsIsRefusedWhileQuiet) {
  void* a = Alloc(8 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  AllocationHints h;
  h.accessed_by = {0};
  absl::Status s = alloc_->SetHints(a, h);
  EXPECT_EQ(UncapturableCalls(), before) << "SetHints made an advise call while quiet: " << s;
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
}

// Review bug 3 (fixed): ForgetStream on a two-device allocator, with device 1 quiet, fails
// but has already forgotten the stream on device 0.
TEST_F(PoolQuietTest, ForgetStreamRefusedOnOneDeviceChangesNoDevice) {
  Remake("", 2);
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(1, kPool, nullptr).ok());
  const std::string before = Fingerprint(*alloc_);
  const std::int64_t syncs = backend_->CallCount("SynchronizeStream");
  absl::Status s = alloc_->ForgetStream(s1_);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Fingerprint(*alloc_) == before) << "a refused ForgetStream changed device 0";
  EXPECT_EQ(backend_->CallCount("SynchronizeStream"), syncs);
  ASSERT_TRUE(alloc_->EndAllocateToPool(1, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(1, kPool).ok());
}

// Review bug 4 (fixed): with classic segments and discard_on_free, a live pool's block freed
// outside a pool context is discarded (OnFreed has no pool check outside
// arenas), though a graph replays into it.
TEST_F(PoolQuietTest, ClassicDiscardOnFreeSparesALivePoolsBlock) {
  Remake("segments:classic,discard_on_free:1");
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());  // the pool is live (one reference)
  for (const PlacementRecord& r : backend_->Records()) {
    if (r.op != PlacementRecord::Op::kDiscard) continue;
    const auto lo = reinterpret_cast<std::uintptr_t>(r.ptr);
    const auto t = reinterpret_cast<std::uintptr_t>(a);
    EXPECT_FALSE(lo < t + 4 * kMiB && t < lo + r.bytes) << "discarded a live pool's free block";
  }
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

// Review bug 5 (fixed): a new segment made while quiet gets its placement calls anyway:
// classic segments are prefetched (PrepareSegment), arenas advised (NewArena).
TEST_F(PoolQuietTest, AClassicSegmentMadeWhileQuietIsPlacedAfter) {
  Remake("segments:classic");
  backend_->SetCapturing(s1_, true);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  void* a = Alloc(4 * kMiB, 0, s1_);
  EXPECT_EQ(UncapturableCalls(), before) << "prefetch=" << backend_->CallCount("PrefetchBatch")
                                         << "/" << backend_->CallCount("Prefetch");
  backend_->SetCapturing(s1_, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_F(PoolQuietTest, AnArenaMadeWhileQuietIsAdvisedAfter) {
  Remake("preferred_location:device");
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  void* a = Alloc(4 * kMiB, 0, s1_);
  EXPECT_EQ(UncapturableCalls(), before) << "advise=" << backend_->CallCount("Advise");
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// Review probe: does an allocation that fails the budget while quiet free memory
// (cudaFree is not allowed during a capture)?
TEST_F(PoolQuietTest, AFailedAllocationWhileQuietFreesNothing) {
  ASSERT_TRUE(alloc_->SetMemoryFraction(1.0 / 64, 0).ok());  // 16 MiB
  void* a = Alloc(12 * kMiB, 0, s2_);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::int64_t frees = backend_->CallCount("FreeManaged");
  const std::int64_t before = UncapturableCalls();
  auto p = alloc_->Allocate(12 * kMiB, 0, s1_);
  EXPECT_FALSE(p.ok());
  EXPECT_EQ(backend_->CallCount("FreeManaged"), frees);
  EXPECT_EQ(UncapturableCalls(), before);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ExpectInvariants();
}

// Review bug 3b (fixed): the same for EmptyCache: device 0's cache is emptied, then device
// 1's refusal is returned.
TEST_F(PoolQuietTest, EmptyCacheRefusedOnOneDeviceChangesNoDevice) {
  Remake("", 2);
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(1, kPool, nullptr).ok());
  const std::int64_t reserved = Stats(0).reserved_bytes[kAllPools].current;
  absl::Status s = alloc_->EmptyCache();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(Stats(0).reserved_bytes[kAllPools].current, reserved)
      << "a refused EmptyCache emptied device 0";
  ASSERT_TRUE(alloc_->EndAllocateToPool(1, kPool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(1, kPool).ok());
}

// Review probe (held): a slept disposable block moved to the host keeps
// pages_discarded; reserved_bytes still matches the backend after its free.
TEST_F(PoolQuietTest, MoveToHostAfterSleepThenFreeKeepsTheAccounting) {
  for (bool dead : {false, true}) {
    void* keep = Alloc(2 * kMiB, 0, s1_);
    void* a = Alloc(16 * kMiB, 0, s1_);
    ASSERT_TRUE(alloc_->SetDisposable(a, true).ok());
    // Migrating `keep` (a staging Sleep would discard its page too, which
    // reserved_bytes also counts until the Wake).
    ASSERT_TRUE(alloc_->Sleep(0, s1_, SleepLevel::kMigrate).ok());
    ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
    // (By design, reserved_bytes still counts the discarded pages here,
    // until the free or a Wake: not checked.)
    ASSERT_TRUE(alloc_->Move(a, Location::Host(), s1_, dead).ok());
    ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
    ASSERT_TRUE(alloc_->Free(a).ok());
    ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
    EXPECT_EQ(Stats().reserved_bytes[kAllPools].current,
              static_cast<std::int64_t>(backend_->PopulatedBytes(0)))
        << "dead=" << dead << ": reserved vs populated after the free";
    ASSERT_TRUE(alloc_->Free(keep).ok());
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    ExpectInvariants();
  }
}

// Advice for an allocation cannot be given while quiet (an Advise call);
// such a request is refused, clearly, before anything changes.
TEST_F(PoolQuietTest, AllocationHintsAreRefusedWhileQuiet) {
  AllocationHints h;
  h.accessed_by = {0};
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  const std::string before = Fingerprint(*alloc_);
  const std::int64_t calls = UncapturableCalls();
  auto p = alloc_->Allocate(4 * kMiB, 0, s1_, &h);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), ::testing::HasSubstr("advice"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_EQ(UncapturableCalls(), calls);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  auto q = alloc_->Allocate(4 * kMiB, 0, s2_, &h);  // outside a context: applied
  ASSERT_TRUE(q.ok());
  EXPECT_THAT(backend_->GetRangeAttributes(*q, 4 * kMiB)->accessed_by, ::testing::Contains(0));
  ASSERT_TRUE(alloc_->Free(*q).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// A pool released during its context, with a deferred free
// of one of its blocks; everything goes back once the context ends.
TEST_F(PoolQuietTest, ReleaseDuringContextWithDeferredFreeLeavesNothing) {
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, Only(s1_)).ok());
  void* a = Alloc(4 * kMiB, 0, s1_);
  void* b = Alloc(700, 0, s1_);
  ASSERT_TRUE(alloc_->RecordStream(a, s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());  // deferred
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  ExpectInvariants();
  EXPECT_EQ(alloc_->ReleasePool(0, kPool).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(Stats().active[kAllPools].current, 0);
  ExpectInvariants();
}

}  // namespace
}  // namespace cma
