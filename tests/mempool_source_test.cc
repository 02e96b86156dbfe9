// Pools whose segments come from another allocator (allocator/
// segment_source.h, PyTorch's MemPool(allocator=...)): served by the same
// caching engine as cma's own pools, in arena mode (the default) and
// classic, on the host backend.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"
#include "tests/segment_source_test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

class PoolSourceTest : public MemPoolFixture, public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override { Remake(GetParam()); }
  void TearDown() override {
    MemPoolFixture::TearDown();  // destroys the allocator: every segment goes back
    EXPECT_TRUE(log_.live.empty());
    EXPECT_TRUE(log_.destroyed);
  }
  void MakePool(MemPoolId id) {
    ASSERT_TRUE(alloc_->CreatePoolWithSource(0, id, std::make_shared<FakeSource>(&log_)).ok());
  }
  // A new pool of a FakeSource holding one block of `bytes` on s1_,
  // allocated in a context that has ended.
  void* NewPoolWithOneBlock(MemPoolId id, std::size_t bytes) {
    MakePool(id);
    EXPECT_TRUE(alloc_->BeginAllocateToPool(0, id, Only(s1_)).ok());
    void* p = Alloc(bytes, 0, s1_);
    EndContext(id);
    return p;
  }
  // The end of a pool context, as PyTorch's use_mem_pool ends it: the
  // context's reference goes too.
  void EndContext(MemPoolId id) {
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, id).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, id).ok());
  }
  bool InSource(void* p) const { return InSourceMemory(log_, p); }
  // Backend calls that place or give back managed memory.
  std::int64_t PlacementCalls() {
    std::int64_t n = 0;
    for (const char* m : {"Prefetch", "PrefetchBatch", "DiscardBatch", "DiscardAndPrefetchBatch",
                          "Advise", "FreeManaged"}) {
      n += backend_->CallCount(m);
    }
    return n;
  }
  SourceLog log_;
};

TEST_P(PoolSourceTest, SegmentsComeFromTheSourceWithPyTorchsSizesAndAreCachedPerPool) {
  const MemPoolId pool{5, 0};
  MakePool(pool);
  const DeviceStats before = Stats();
  const std::int64_t managed = backend_->CallCount("AllocateManaged") +
                               backend_->CallCount("ReserveManaged");
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
  void* a = Alloc(512, 0, s1_);
  void* b = Alloc(1000, 0, s1_);        // the same 2 MiB segment, split
  void* c = Alloc(5 * kMiB, 0, s1_);    // a 20 MiB one
  void* d = Alloc(31 * kMiB, 0, s1_);   // the request rounded to 2 MiB
  const DeviceStats in = Stats();
  void* shared = Alloc(512, 0, s2_);    // another stream: the shared cache
  for (void* p : {a, b, c, d}) EXPECT_TRUE(InSource(p));
  EXPECT_FALSE(InSource(shared));
  EXPECT_THAT(log_.allocs, ::testing::ElementsAre(2 * kMiB, 20 * kMiB, 32 * kMiB));
  EXPECT_EQ(in.segment[kSmallPool].current - before.segment[kSmallPool].current, 1);
  EXPECT_EQ(in.segment[kLargePool].current - before.segment[kLargePool].current, 2);
  EXPECT_GE(in.reserved_bytes[kAllPools].current - before.reserved_bytes[kAllPools].current,
            static_cast<std::int64_t>(54 * kMiB));
  // Freed and allocated again in the pool: the cache serves, no new segment.
  ASSERT_TRUE(alloc_->Free(c).ok());
  void* c2 = Alloc(5 * kMiB, 0, s1_);
  EXPECT_EQ(c2, c);
  EXPECT_EQ(log_.allocs.size(), 3u);
  EndContext(pool);
  // Nothing was placed, advised or discarded; no managed memory was taken
  // for the pool.
  EXPECT_EQ(backend_->CallCount("AllocateManaged") + backend_->CallCount("ReserveManaged") -
                managed,
            1);  // the shared cache's one segment or arena
  ExpectInvariants();
  for (void* p : {a, b, c2, d, shared}) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_TRUE(log_.live.empty());
  EXPECT_EQ(log_.frees.size(), 3u);
  EXPECT_TRUE(log_.destroyed);  // the pool is gone and so are its segments
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
}

TEST_P(PoolSourceTest, NoPlacementCallTouchesTheSourcesMemory) {
  const MemPoolId pool{5, 0};
  void* a = NewPoolWithOneBlock(pool, 3 * kMiB);
  std::memset(a, 0x5a, 3 * kMiB);
  const std::int64_t calls = PlacementCalls();
  // Move and advice are refused, naming why; nothing changes.
  const std::string fingerprint = Fingerprint(*alloc_);
  absl::Status m = alloc_->Move(a, Location::Host(), s1_);
  EXPECT_EQ(m.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.message(), HasSubstr("not managed memory"));
  AllocationHints hints;
  hints.read_mostly = true;
  absl::Status h = alloc_->SetHints(a, hints);
  EXPECT_EQ(h.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(h.message(), HasSubstr("not managed memory"));
  EXPECT_EQ(Fingerprint(*alloc_), fingerprint);
  // A Sleep, even one that discards everything, leaves it where it is.
  ASSERT_TRUE(alloc_->Sleep(0, s1_, SleepLevel::kDiscard).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_EQ(PlacementCalls(), calls);
  EXPECT_EQ(static_cast<unsigned char*>(a)[3 * kMiB - 1], 0x5a);
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ExpectInvariants();
}

TEST_P(PoolSourceTest, ADissolvedPoolsMemoryNeverServesTheSharedCache) {
  const MemPoolId pool{5, 0};
  void* a = NewPoolWithOneBlock(pool, 4 * kMiB);
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());  // dissolved: its segment waits to go back
  EXPECT_FALSE(log_.destroyed);
  for (int i = 0; i < 4; ++i) {
    void* p = Alloc(4 * kMiB, 0, s1_);
    EXPECT_FALSE(InSource(p));
    ASSERT_TRUE(alloc_->Free(p).ok());
  }
  ExpectInvariants();
  // Released, the pool is known until its memory has gone back: its id
  // cannot be given another allocator meanwhile.
  SourceLog other;
  const absl::Status refused =
      alloc_->CreatePoolWithSource(0, pool, std::make_shared<FakeSource>(&other));
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("released, its segments go back"));
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_TRUE(log_.live.empty());
  EXPECT_TRUE(log_.destroyed);
  // Then the id is free: a new pool, with a new source.
  SourceLog third;
  ASSERT_TRUE(alloc_->CreatePoolWithSource(0, pool, std::make_shared<FakeSource>(&third)).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  EXPECT_TRUE(third.destroyed);
}

TEST_P(PoolSourceTest, ALivePoolKeepsItsSegmentsThroughEmptyCache) {
  const MemPoolId pool{5, 0};
  void* a = NewPoolWithOneBlock(pool, 4 * kMiB);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(alloc_->EmptyPoolCache(0, pool).ok());  // referenced: kept
  EXPECT_EQ(log_.live.size(), 1u);
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  EXPECT_FALSE(log_.destroyed);  // its segment still holds it
  ASSERT_TRUE(alloc_->EmptyPoolCache(0, pool).ok());
  EXPECT_TRUE(log_.live.empty());
  EXPECT_TRUE(log_.destroyed);
}

TEST_P(PoolSourceTest, OutOfMemoryFromTheSourceOrTheBudgetChangesNothing) {
  const MemPoolId pool{5, 0};
  MakePool(pool);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
  void* a = Alloc(512, 0, s1_);
  const DeviceStats before = Stats();
  log_.fail_alloc = true;
  absl::StatusOr<void*> b = alloc_->Allocate(4 * kMiB, 0, s1_);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("fake allocator: out of memory"));
  log_.fail_alloc = false;
  EndContext(pool);
  // The source's memory counts against the budget (a memory fraction).
  ASSERT_TRUE(alloc_->SetMemoryFraction(8.0 * kMiB / (std::size_t{1} << 30), 0).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
  absl::StatusOr<void*> c = alloc_->Allocate(12 * kMiB, 0, s1_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("budget"));
  EXPECT_EQ(log_.allocs.size(), 1u);  // the budget refused before the source was asked
  EndContext(pool);
  // Only the out-of-memory counters moved.
  const DeviceStats after = Stats();
  EXPECT_EQ(after.num_ooms - before.num_ooms, 2);
  EXPECT_EQ(after.segment[kAllPools].current, before.segment[kAllPools].current);
  EXPECT_EQ(after.reserved_bytes[kAllPools].current, before.reserved_bytes[kAllPools].current);
  EXPECT_EQ(after.allocated_bytes[kAllPools].current, before.allocated_bytes[kAllPools].current);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ExpectInvariants();
}

TEST_P(PoolSourceTest, AFailedFreeKeepsTheSegmentCachedUntilTheNextRelease) {
  const MemPoolId pool{5, 0};
  void* a = NewPoolWithOneBlock(pool, 4 * kMiB);
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  log_.fail_free = true;
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(log_.live.size(), 1u);
  EXPECT_EQ(Stats().segment[kAllPools].current >= 1, true);
  ExpectInvariants();
  log_.fail_free = false;
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_TRUE(log_.live.empty());
}

TEST_P(PoolSourceTest, AUseOnOomPoolLendsItsFreeBlockAndGetsItBack) {
  const MemPoolId pool{5, 0};
  MakePool(pool);
  ASSERT_TRUE(alloc_->SetPoolOptions(0, pool, {.no_split = false, .use_on_oom = true}).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
  void* a = Alloc(12 * kMiB, 0, s1_);
  EndContext(pool);
  ASSERT_TRUE(alloc_->Free(a).ok());
  // The shared cache has no room left: the pool's free block serves.
  ASSERT_TRUE(alloc_->SetMemoryFraction(12.0 * kMiB / (std::size_t{1} << 30), 0).ok());
  absl::StatusOr<void*> b = alloc_->Allocate(12 * kMiB, 0, s1_);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, a);
  ASSERT_TRUE(alloc_->Free(*b).ok());
  EXPECT_EQ(log_.allocs.size(), 1u);
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ExpectInvariants();
}

TEST_P(PoolSourceTest, BadInputIsRefusedAndChangesNothing) {
  const MemPoolId pool{5, 0};
  EXPECT_EQ(alloc_->CreatePoolWithSource(0, pool, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->CreatePoolWithSource(3, pool, std::make_shared<FakeSource>(&log_)).code(),
            absl::StatusCode::kInvalidArgument);  // no device 3
  EXPECT_TRUE(log_.destroyed);  // the refused source was dropped
  log_.destroyed = false;
  MakePool(pool);
  SourceLog other;
  absl::Status again =
      alloc_->CreatePoolWithSource(0, pool, std::make_shared<FakeSource>(&other));
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(again.message(), HasSubstr("exists already"));
  EXPECT_TRUE(other.destroyed);
  EXPECT_EQ(*alloc_->GetPoolUseCount(0, pool), 1);
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  EXPECT_TRUE(log_.destroyed);  // no segment: gone with its pool
}

INSTANTIATE_TEST_SUITE_P(Modes, PoolSourceTest,
                         ::testing::Values("", "segments:classic"),
                         [](const auto& info) {
                           return std::string(info.param[0] == '\0' ? "Arena" : "Classic");
                         });

}  // namespace
}  // namespace cma

// Directed cases from the review of pools of another allocator.
namespace cma {
namespace {

// Source whose Free records whether the segment's stream still had work queued.
struct WatchLog : SourceLog {
  HostBackend* backend = nullptr;
  Stream watched = 0;
  std::vector<std::int64_t> pending_at_free;
};
class WatchingSource final : public SegmentSource {
 public:
  explicit WatchingSource(WatchLog* log) : inner_(log), log_(log) {}
  absl::StatusOr<void*> Allocate(int d, std::size_t bytes, Stream s) override {
    return inner_.Allocate(d, bytes, s);
  }
  absl::Status Free(int d, void* ptr, std::size_t bytes) override {
    log_->pending_at_free.push_back(log_->backend->PendingWork(log_->watched));
    return inner_.Free(d, ptr, bytes);
  }
 private:
  FakeSource inner_;
  WatchLog* log_;
};

class PoolSourceDirectedTest : public MemPoolFixture {
 protected:
  // A released pool of a WatchingSource whose one block was freed while a
  // kernel on s1_ still uses it: its segment waits to go back.
  void FreeWhileItsStreamWorks(WatchLog* log) {
    log->backend = backend_.get();
    log->watched = s1_;
    const MemPoolId pool{5, 0};
    ASSERT_TRUE(alloc_->CreatePoolWithSource(0, pool, std::make_shared<WatchingSource>(log)).ok());
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
    void* a = Alloc(4 * kMiB, 0, s1_);
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
    ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());  // a kernel still using `a`
    ASSERT_TRUE(alloc_->Free(a).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  }
};

// Another allocator's free does not wait for the GPU as cudaFree does: the
// destructor (cma_shutdown) waits for the segment's streams first, as
// EmptyCache does.
TEST_F(PoolSourceDirectedTest, DestructorWaitsForTheStreamsBeforeGivingSourcedMemoryBack) {
  WatchLog log;
  ASSERT_NO_FATAL_FAILURE(FreeWhileItsStreamWorks(&log));
  alloc_.reset();  // cma_shutdown
  ASSERT_EQ(log.pending_at_free.size(), 1u);
  EXPECT_EQ(log.pending_at_free[0], 0) << "the source got its memory back with work queued";
}

TEST_F(PoolSourceDirectedTest, EmptyCacheWaitsBeforeGivingSourcedMemoryBack) {
  WatchLog log;
  ASSERT_NO_FATAL_FAILURE(FreeWhileItsStreamWorks(&log));
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_EQ(log.pending_at_free.size(), 1u);
  EXPECT_EQ(log.pending_at_free[0], 0);
}

// A lent block outlives its pool's last reference: the pool drains after it.
TEST_F(PoolSourceDirectedTest, LentBlockThenReleaseThenFreeDrains) {
  for (const char* mode : {"", "segments:classic"}) {
    SCOPED_TRACE(mode);
    Remake(mode);
    SourceLog log;
    const MemPoolId pool{5, 0};
    ASSERT_TRUE(alloc_->CreatePoolWithSource(0, pool, std::make_shared<FakeSource>(&log)).ok());
    ASSERT_TRUE(alloc_->SetPoolOptions(0, pool, {.no_split = false, .use_on_oom = true}).ok());
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
    void* a = Alloc(12 * kMiB, 0, s1_);
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
    ASSERT_TRUE(alloc_->Free(a).ok());
    ASSERT_TRUE(alloc_->SetMemoryFraction(12.0 * kMiB / (std::size_t{1} << 30), 0).ok());
    absl::StatusOr<void*> b = alloc_->Allocate(12 * kMiB, 0, s1_);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(*b, a);
    ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    EXPECT_EQ(log.live.size(), 1u);
    ExpectInvariants();
    ASSERT_TRUE(alloc_->Free(*b).ok());
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    EXPECT_TRUE(log.live.empty());
    EXPECT_TRUE(log.destroyed);
    EXPECT_FALSE(alloc_->GetPoolUseCount(0, pool).ok());
    ExpectInvariants();
    for (Stream s : {s1_, s2_}) ASSERT_TRUE(backend_->CompleteWork(s).ok());
    alloc_.reset();
  }
}

// MoveBatch refuses a sourced pointer of device 1 before device 0's
// pointers move.
TEST_F(PoolSourceDirectedTest, RefusedMoveBatchChangesNothing) {
  Remake("", 2);
  SourceLog log;
  const MemPoolId pool{5, 0};
  void* p0 = Alloc(4 * kMiB, 0, kDefaultStream);
  ASSERT_TRUE(alloc_->CreatePoolWithSource(1, pool, std::make_shared<FakeSource>(&log)).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(1, pool, nullptr).ok());
  void* q1 = Alloc(4 * kMiB, 1, kDefaultStream);
  ASSERT_TRUE(alloc_->EndAllocateToPool(1, pool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(1, pool).ok());
  const std::string before = Fingerprint(*alloc_);
  backend_->ClearRecords();
  void* both[] = {p0, q1};
  absl::Status s = alloc_->MoveBatch(both, Location::Host(), kDefaultStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Fingerprint(*alloc_) == before) << "state changed";
  EXPECT_EQ(Stats(0).moves, 0);
  for (const PlacementRecord& r : backend_->Records()) {
    ADD_FAILURE() << "placement call made: op " << static_cast<int>(r.op) << " on " << r.ptr
                  << " (" << r.bytes << " bytes) to host=" << r.location.is_host();
  }
  ASSERT_TRUE(alloc_->Free(p0).ok());
  ASSERT_TRUE(alloc_->Free(q1).ok());
  ASSERT_TRUE(alloc_->ReleasePool(1, pool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
}

// A source whose memory is 256-byte aligned (cudaMalloc's guarantee, RMM's
// pool alignment), as PyTorch's MemPool(allocator=...) may get.
class Aligned256Source final : public SegmentSource {
 public:
  explicit Aligned256Source(int* live) : live_(live) {}
  absl::StatusOr<void*> Allocate(int, std::size_t bytes, Stream) override {
    char* p = static_cast<char*>(std::aligned_alloc(4096, bytes + 4096));
    ++*live_;
    return p + 256;
  }
  absl::Status Free(int, void* ptr, std::size_t) override {
    std::free(static_cast<char*>(ptr) - 256);
    --*live_;
    return absl::OkStatus();
  }
 private:
  int* live_;
};

TEST_F(PoolSourceDirectedTest, CheckpointOfAPoolWith256AlignedSourceRestores) {
  int live = 0;
  const MemPoolId pool{5, 0};
  ASSERT_TRUE(alloc_->CreatePoolWithSource(0, pool, std::make_shared<Aligned256Source>(&live)).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
  void* a = Alloc(512, 0, s1_);
  void* b = Alloc(512, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  absl::StatusOr<PoolCheckpoint> cp = alloc_->TakePoolCheckpoint(0, pool);
  ASSERT_TRUE(cp.ok()) << cp.status();
  ASSERT_TRUE(alloc_->Free(b).ok());
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(*cp);
  EXPECT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(alloc_->Free(a).ok());
  if (r.ok()) ASSERT_TRUE(alloc_->Free(b).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(live, 0);
}

}  // namespace
}  // namespace cma

namespace cma {
namespace {

// A broken source that hands out the same memory twice.
class RepeatingSource final : public SegmentSource {
 public:
  explicit RepeatingSource(int* frees) : frees_(frees) {}
  ~RepeatingSource() override { std::free(mem_); }
  absl::StatusOr<void*> Allocate(int, std::size_t bytes, Stream) override {
    if (mem_ == nullptr) mem_ = std::aligned_alloc(4096, bytes);
    return mem_;
  }
  absl::Status Free(int, void*, std::size_t) override {
    ++*frees_;
    return absl::OkStatus();  // the memory stays ours until the destructor
  }

 private:
  void* mem_ = nullptr;
  int* frees_;
};

TEST_F(PoolSourceDirectedTest, MemoryOverlappingASegmentIsRefusedAndNotGivenBack) {
  int frees = 0;
  const MemPoolId pool{5, 0};
  ASSERT_TRUE(alloc_->CreatePoolWithSource(0, pool, std::make_shared<RepeatingSource>(&frees)).ok());
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, Only(s1_)).ok());
  void* a = Alloc(12 << 20, 0, s1_);
  const DeviceStats before = Stats();
  absl::StatusOr<void*> b = alloc_->Allocate(12 << 20, 0, s1_);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(b.status().message(), ::testing::HasSubstr("overlaps a segment"));
  EXPECT_EQ(frees, 0);  // freeing it would have freed `a`'s segment
  EXPECT_EQ(Stats().segment[kAllPools].current, before.segment[kAllPools].current);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(frees, 1);
  ExpectInvariants();
}

}  // namespace
}  // namespace cma
