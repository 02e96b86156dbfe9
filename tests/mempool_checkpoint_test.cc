// Private pools' use counts, empty_cache, checkpoints and restores (the state
// torch.compile's cudagraph trees take and restore), the accumulated-stat
// reset and the pool in snapshots, on the host backend.
#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr MemPoolId kPool{1, 0};
constexpr MemPoolId kOther{2, 0};

class PoolCheckpointTest : public MemPoolFixture,
                           public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override { Remake(GetParam()); }
  // Allocations made in the pool (every stream), as a graph recording would.
  std::vector<void*> InPool(std::initializer_list<std::pair<std::size_t, Stream>> sizes) {
    EXPECT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
    std::vector<void*> out;
    for (auto [n, s] : sizes) out.push_back(Alloc(n, 0, s));
    EXPECT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
    EXPECT_TRUE(alloc_->ReleasePool(0, kPool).ok());  // the context's reference
    return out;
  }
  const BlockSnapshot* BlockAt(void* p) {
    snapshot_ = alloc_->Snapshot();
    for (const SegmentSnapshot& s : snapshot_) {
      for (const BlockSnapshot& b : s.blocks) {
        if (b.address == reinterpret_cast<std::uintptr_t>(p)) return &b;
      }
    }
    return nullptr;
  }
  static std::vector<void*> Ptrs(const std::vector<PoolAllocation>& v) {
    std::vector<void*> out;
    for (const PoolAllocation& a : v) out.push_back(a.ptr);
    return out;
  }
  static std::vector<void*> Sorted(std::vector<void*> v) {
    std::sort(v.begin(), v.end());
    return v;
  }
  std::vector<SegmentSnapshot> snapshot_;
};

INSTANTIATE_TEST_SUITE_P(Modes, PoolCheckpointTest,
                         ::testing::Values("segments:arena", "segments:classic"));

TEST_P(PoolCheckpointTest, UseCountsFollowCreateBeginEndAndRelease) {
  EXPECT_EQ(alloc_->GetPoolUseCount(0, kPool).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  EXPECT_EQ(*alloc_->GetPoolUseCount(0, kPool), 1);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr).ok());
  EXPECT_EQ(*alloc_->GetPoolUseCount(0, kPool), 2);
  void* p = Alloc(kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  EXPECT_EQ(*alloc_->GetPoolUseCount(0, kPool), 2);  // as PyTorch: release gives it back
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  EXPECT_EQ(*alloc_->GetPoolUseCount(0, kPool), 1);
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  EXPECT_EQ(*alloc_->GetPoolUseCount(0, kPool), 0);  // p keeps it alive
  EXPECT_EQ(alloc_->GetPoolUseCount(0, kOther).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->GetPoolUseCount(5, kPool).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc_->Free(p).ok());  // the last: released and empty
  // Its own segment drains with it: known, use count 0, until the cache's
  // memory goes back.
  EXPECT_EQ(*alloc_->GetPoolUseCount(0, kPool), 0);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_THAT(alloc_->GetPoolUseCount(0, kPool).status().message(), HasSubstr("does not exist"));
}

TEST_P(PoolCheckpointTest, RestoreAfterFreesRecreatesTheCheckpointsAllocations) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  std::vector<void*> p = InPool({{3 * kMiB, s1_}, {5000, s2_}, {12 * kMiB, s1_}});
  absl::StatusOr<PoolCheckpoint> cp = alloc_->TakePoolCheckpoint(0, kPool);
  ASSERT_TRUE(cp.ok()) << cp.status();
  EXPECT_EQ(cp->pool, kPool);
  ASSERT_EQ(cp->allocations.size(), 3u);
  const DeviceStats at_checkpoint = Stats();
  // The graph's outputs die, one survives.
  ASSERT_TRUE(alloc_->Free(p[0]).ok());
  ASSERT_TRUE(alloc_->Free(p[2]).ok());
  ExpectInvariants();
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(*cp);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectInvariants();
  EXPECT_THAT(Ptrs(r->freed), ElementsAre(p[1]));  // live before: reported freed too
  EXPECT_EQ(Sorted(Ptrs(r->created)), Sorted(p));
  EXPECT_THAT(r->kept, ElementsAre(p[1]));
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, p));
  for (const PoolAllocation& a : cp->allocations) {
    const BlockSnapshot* b = BlockAt(a.ptr);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(b->state, "active_allocated");
    EXPECT_EQ(b->size, a.size);
    EXPECT_EQ(b->requested, a.requested);
    EXPECT_EQ(b->stream, a.stream);
    EXPECT_EQ(b->pool, kPool);
  }
  const DeviceStats now = Stats();
  for (auto stat : {&DeviceStats::allocated_bytes, &DeviceStats::requested_bytes,
                     &DeviceStats::reserved_bytes}) {
    EXPECT_EQ((now.*stat)[kAllPools].current, (at_checkpoint.*stat)[kAllPools].current);
  }
  // The new owners free them; the pool's blocks serve it again.
  for (void* q : p) ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

TEST_P(PoolCheckpointTest, RestoreAfterNewAllocationsFreesThemAndCarvesUnderThem) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  std::vector<void*> p = InPool({{4 * kMiB, s1_}, {6 * kMiB, s1_}});
  const PoolCheckpoint cp = *alloc_->TakePoolCheckpoint(0, kPool);
  // Another branch of the tree: p[1] dies, new allocations reuse its memory
  // (a smaller one at its address, split from it) and take more.
  ASSERT_TRUE(alloc_->Free(p[1]).ok());
  std::vector<void*> q = InPool({{2 * kMiB, s1_}, {kMiB, s1_}, {9 * kMiB, s1_}});
  EXPECT_EQ(q[0], p[1]);
  ExpectInvariants();
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(cp);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectInvariants();
  EXPECT_EQ(Sorted(Ptrs(r->freed)), Sorted({p[0], q[0], q[1], q[2]}));
  EXPECT_EQ(Sorted(Ptrs(r->created)), Sorted(p));
  EXPECT_THAT(r->kept, ElementsAre(p[0]));
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, p));
  EXPECT_EQ(BlockAt(p[1])->requested, 6 * kMiB);
  EXPECT_EQ(Stats().requested_bytes[kAllPools].current, static_cast<std::int64_t>(10 * kMiB));
  // q's memory is the pool's free memory again: the pool reuses it.
  std::vector<void*> again = InPool({{9 * kMiB, s1_}});
  EXPECT_GE(static_cast<char*>(again[0]), static_cast<char*>(q[0]));
  EXPECT_LT(static_cast<char*>(again[0]), static_cast<char*>(q[2]) + 9 * kMiB);
  for (void* x : {p[0], p[1], again[0]}) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

TEST_P(PoolCheckpointTest, AnIdenticalAllocationStaysInPlaceWithTheCheckpointsSizeAndStream) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  std::vector<void*> p = InPool({{4 * kMiB, s1_}});
  const PoolCheckpoint cp = *alloc_->TakePoolCheckpoint(0, kPool);
  ASSERT_TRUE(alloc_->Free(p[0]).ok());
  // Same block, another request size and stream.
  std::vector<void*> q = InPool({{4 * kMiB - 100, s1_}});
  ASSERT_EQ(q[0], p[0]);
  ASSERT_TRUE(alloc_->RecordStream(q[0], s2_).ok());
  const std::int64_t discards = backend_->CallCount("DiscardBatch");
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(cp);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Ptrs(r->freed), ElementsAre(p[0]));
  EXPECT_EQ(r->freed[0].requested, 4 * kMiB - 100);
  EXPECT_THAT(Ptrs(r->created), ElementsAre(p[0]));
  EXPECT_EQ(r->created[0].requested, 4 * kMiB);
  EXPECT_THAT(r->kept, ElementsAre(p[0]));
  EXPECT_EQ(BlockAt(p[0])->requested, 4 * kMiB);
  EXPECT_EQ(backend_->CallCount("DiscardBatch"), discards);  // its contents stay
  ExpectInvariants();
  // Its free still waits for s2, which used it before the restore.
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(p[0]).ok());
  EXPECT_EQ(BlockAt(p[0])->state, "active_pending_free");
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

// A checkpoint allocation over free blocks of two streams becomes one block
// of its stream, whose work waits (on the GPU) for the other stream's.
TEST_P(PoolCheckpointTest, CarvingAcrossStreamsOrdersAfterTheStreamsThatFreed) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  // A pool's blocks of one segment share its stream, unless a restore
  // hands one out on another: two 8 MiB neighbours in one 20 MiB segment,
  // the upper one restored onto s2.
  std::vector<void*> p = InPool({{8 * kMiB, s1_}, {8 * kMiB, s1_}});
  ASSERT_EQ(static_cast<char*>(p[1]), static_cast<char*>(p[0]) + 8 * kMiB);
  for (void* x : p) ASSERT_TRUE(alloc_->Free(x).ok());
  PoolCheckpoint split{0, kPool, {{p[0], 8 * kMiB, 8 * kMiB, s1_}, {p[1], 8 * kMiB, 8 * kMiB, s2_}}};
  ASSERT_TRUE(alloc_->RestorePoolCheckpoint(split).ok());
  for (void* x : p) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // s2 still runs: s1 must wait for it
  PoolCheckpoint cp{0, kPool, {{p[0], 16 * kMiB, 16 * kMiB - 7, s1_}}};
  const std::int64_t waits = backend_->CallCount("StreamWaitEvent");
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(cp);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(backend_->CallCount("StreamWaitEvent"), waits + 1);
  const BlockSnapshot* b = BlockAt(p[0]);
  EXPECT_EQ(b->size, 16 * kMiB);
  EXPECT_EQ(b->stream, s1_);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(p[0]).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_P(PoolCheckpointTest, AnImpossibleRestoreIsRefusedAndChangesNothing) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  std::vector<void*> p = InPool({{4 * kMiB, s1_}, {6 * kMiB, s1_}});
  const PoolCheckpoint cp = *alloc_->TakePoolCheckpoint(0, kPool);
  ASSERT_TRUE(alloc_->Free(p[1]).ok());
  std::vector<void*> q = InPool({{2 * kMiB, s1_}});
  ASSERT_EQ(q[0], p[1]);
  // q is also used on s2: its memory cannot be handed out again at once.
  ASSERT_TRUE(alloc_->RecordStream(q[0], s2_).ok());
  std::string before = Fingerprint(*alloc_);
  absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(cp);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("record_stream"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  // Freed, but s2's work still runs: still not free.
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(q[0]).ok());
  before = Fingerprint(*alloc_);
  r = alloc_->RestorePoolCheckpoint(cp);
  EXPECT_THAT(r.status().message(), HasSubstr("awaiting its streams"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  // Once s2 is done, the restore goes through.
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  r = alloc_->RestorePoolCheckpoint(cp);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(*alloc_->CheckPoolLiveAllocations(0, kPool, p));
  for (void* x : p) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

TEST_P(PoolCheckpointTest, BadCheckpointsAndStatesAreClearErrorsThatChangeNothing) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  std::vector<void*> p = InPool({{4 * kMiB, s1_}});
  void* shared = Alloc(kMiB, 0, s1_);
  PoolCheckpoint cp = *alloc_->TakePoolCheckpoint(0, kPool);
  const std::string before = Fingerprint(*alloc_);
  EXPECT_EQ(alloc_->TakePoolCheckpoint(0, kOther).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->TakePoolCheckpoint(4, kPool).status().code(),
            absl::StatusCode::kInvalidArgument);
  PoolCheckpoint bad = cp;
  bad.device = 7;
  EXPECT_EQ(alloc_->RestorePoolCheckpoint(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = cp;
  bad.pool = kOther;
  EXPECT_THAT(alloc_->RestorePoolCheckpoint(bad).status().message(), HasSubstr("does not exist"));
  bad = cp;
  bad.allocations.push_back(bad.allocations[0]);  // overlapping
  EXPECT_THAT(alloc_->RestorePoolCheckpoint(bad).status().message(), HasSubstr("malformed"));
  bad = cp;  // memory of the shared cache
  bad.allocations.push_back({shared, kMiB, kMiB, s1_});
  EXPECT_THAT(alloc_->RestorePoolCheckpoint(bad).status().message(), HasSubstr("in use"));
  int local = 0;
  bad = cp;  // no memory of this allocator at all
  bad.allocations.push_back({&local, 512, 4, s1_});
  EXPECT_THAT(alloc_->RestorePoolCheckpoint(bad).status().message(), HasSubstr("segment"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  // A context of the device is open.
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kOther, Only(s2_)).ok());
  EXPECT_EQ(alloc_->RestorePoolCheckpoint(cp).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kOther).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kOther).ok());
  // Released with p live: a freeable pool, which PyTorch does not checkpoint.
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  EXPECT_THAT(alloc_->RestorePoolCheckpoint(cp).status().message(), HasSubstr("no reference"));
  EXPECT_EQ(alloc_->TakePoolCheckpoint(0, kPool).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (void* x : {p[0], shared}) ASSERT_TRUE(alloc_->Free(x).ok());
  ExpectInvariants();
}

// What the pool does after a restore of `cp`: where a few allocations in it
// land, and the statistics once they are freed. The same for two
// allocators means that they behave identically.
std::string AfterRestore(CachingManagedAllocator& a, const PoolCheckpoint& cp, Stream s) {
  absl::StatusOr<PoolRestoreResult> r = a.RestorePoolCheckpoint(cp);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(a.BeginAllocateToPool(0, kPool, nullptr).ok());
  std::string out;
  std::vector<void*> got;
  for (std::size_t n : {std::size_t{1000}, 3 * kMiB, std::size_t{700}, 2 * kMiB + 8}) {
    absl::StatusOr<void*> p = a.Allocate(n, 0, s);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) continue;
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(*p) % 512, 0u) << *p;
    got.push_back(*p);
  }
  // Where each landed, as (segment size, offset in it): mmap places the
  // segments of two allocators differently.
  for (const SegmentSnapshot& seg : a.Snapshot()) {
    for (void* p : got) {
      const auto addr = reinterpret_cast<std::uintptr_t>(p);
      if (addr >= seg.address && addr < seg.address + seg.total_size) {
        absl::StrAppend(&out, seg.total_size, "+", addr - seg.address, " ");
      }
    }
  }
  EXPECT_TRUE(a.EndAllocateToPool(0, kPool).ok());
  EXPECT_TRUE(a.ReleasePool(0, kPool).ok());
  for (void* p : got) EXPECT_TRUE(a.Free(p).ok());
  for (auto& [k, v] : a.GetStats(0)->Flatten()) absl::StrAppend(&out, k, "=", v, ";");
  EXPECT_TRUE(a.CheckInvariants().ok()) << a.CheckInvariants();
  return out;
}

// A checkpoint no allocator could have taken is refused whole, naming what is
// wrong, before anything changes: a 1000-byte block or a pointer 8 bytes in
// was carved, and the pool's next allocation came out misaligned.
TEST_P(PoolCheckpointTest, MalformedCheckpointsAreRefusedAndChangeNothing) {
  const bool classic = absl::StrContains(GetParam(), "classic");
  std::string reference;
  for (bool try_malformed : {false, true}) {
    Remake(GetParam());
    ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
    std::vector<void*> p = InPool({{4 * kMiB, s1_}, {5000, s2_}});
    const PoolCheckpoint cp = *alloc_->TakePoolCheckpoint(0, kPool);
    ASSERT_TRUE(alloc_->Free(p[0]).ok());  // a restore carves p[0] again
    char* const p0 = static_cast<char*>(p[0]);
    if (try_malformed) {
      const std::string before = Fingerprint(*alloc_);
      struct Variant {
        PoolAllocation a;
        const char* why;
        bool added = false;  // else in place of p[0]'s entry
      };
      const PoolAllocation p1 = *std::find_if(
          cp.allocations.begin(), cp.allocations.end(),
          [&](const PoolAllocation& a) { return a.ptr == p[1]; });
      std::vector<Variant> variants = {
          {{p0, 1000, 1000, s1_}, "not a multiple of 512 bytes"},
          {{p0 + 8, 2 * kMiB, 2 * kMiB, s1_}, "not aligned to 512 bytes"},
          {{p0 + 512, 1000, 1000, s1_}, "not a multiple of 512 bytes"},
          {{p0, 0, 0, s1_}, "empty"},
          {{p0, 4 * kMiB, 0, s1_}, "requested with 0 bytes"},
          {{p0, 4 * kMiB, 4 * kMiB + 1, s1_}, "smaller than its request rounded"},
          {{p0, 512, 600, s1_}, "smaller than its request rounded (1024 bytes)"},
          {{p0, ~std::size_t{511}, 512, s1_}, "larger than the device"},
          {{nullptr, 512, 512, s1_}, "not a valid range"},
          {{p0 - 512, 4 * kMiB, 4 * kMiB, s1_}, "inside one segment"},
          {{p0, 4 * kMiB, 4 * kMiB, Stream{0xbad0}}, "stream"},
          {p1, "overlaps the allocation at", /*added=*/true},
      };
      if (classic) variants.push_back({{p0, 4 * kMiB, 1000, s1_}, "large-block segment"});
      for (const Variant& v : variants) {
        // Beside the checkpoint's good allocations: none is applied either.
        PoolCheckpoint bad = cp;
        if (v.added) {
          bad.allocations.push_back(v.a);
        } else {
          for (PoolAllocation& a : bad.allocations) {
            if (a.ptr == p0) a = v.a;
          }
        }
        absl::StatusOr<PoolRestoreResult> r = alloc_->RestorePoolCheckpoint(bad);
        EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << v.why;
        EXPECT_THAT(r.status().message(), HasSubstr("malformed")) << v.why;
        EXPECT_THAT(r.status().message(), HasSubstr(v.why));
        EXPECT_EQ(Fingerprint(*alloc_), before) << v.why;
      }
      ExpectInvariants();
    }
    const std::string after = AfterRestore(*alloc_, cp, s1_);
    if (!try_malformed) reference = after;
    EXPECT_EQ(after, reference) << "the pool works differently after refused restores";
    for (void* x : p) ASSERT_TRUE(alloc_->Free(x).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
    ExpectInvariants();
  }
}

TEST_P(PoolCheckpointTest, EmptyPoolCacheFreesOnlyAReleasedPoolsIdleMemory) {
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  std::vector<void*> p = InPool({{64 * kMiB, s1_}, {512, s1_}});
  void* shared = Alloc(32 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(shared).ok());
  ASSERT_TRUE(alloc_->Free(p[0]).ok());
  const std::int64_t reserved = Stats().reserved_bytes[kAllPools].current;
  // Referenced: a graph may replay into the free block.
  ASSERT_TRUE(alloc_->EmptyPoolCache(0, kPool).ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, reserved);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kOther, Only(s2_)).ok());
  EXPECT_EQ(alloc_->EmptyPoolCache(0, kPool).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kOther).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kOther).ok());
  EXPECT_EQ(alloc_->EmptyPoolCache(3, kPool).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc_->EmptyPoolCache(0, kOther).ok());  // unknown: nothing to do
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, reserved);
  // Released with p[1] live: its idle 64 MiB go, the shared cache's 32 stay.
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ASSERT_TRUE(alloc_->EmptyPoolCache(0, kPool).ok());
  ExpectInvariants();
  const std::int64_t after = Stats().reserved_bytes[kAllPools].current;
  EXPECT_LE(after, reserved - static_cast<std::int64_t>(62 * kMiB));
  EXPECT_GE(after, static_cast<std::int64_t>(32 * kMiB));
  ASSERT_TRUE(alloc_->Free(p[1]).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
}

TEST_P(PoolCheckpointTest, SnapshotsNameEachBlocksPool) {
  std::vector<void*> p = InPool({{kMiB, s1_}});
  ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, kPool).ok());
  void* shared = Alloc(kMiB, 0, s1_);
  EXPECT_EQ(BlockAt(p[0])->pool, kPool);
  EXPECT_EQ(BlockAt(shared)->pool, (MemPoolId{0, 0}));
  for (void* x : {p[0], shared}) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

TEST_P(PoolCheckpointTest, ResetAccumulatedStatsKeepsCurrentAndPeak) {
  void* a = Alloc(3 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(Alloc(kMiB, 0, s1_)).ok());
  EXPECT_EQ(alloc_->Allocate(std::size_t{2} << 30, 0, s1_).status().code(),
            absl::StatusCode::kInvalidArgument);  // larger than the device: no OOM
  const DeviceStats before = Stats();
  ASSERT_GT(before.allocation[kAllPools].allocated, 0);
  ASSERT_GT(before.allocation[kAllPools].freed, 0);
  ASSERT_GT(before.num_device_alloc, 0);
  EXPECT_EQ(alloc_->ResetAccumulatedStats(2).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc_->ResetAccumulatedStats(0).ok());
  const DeviceStats after = Stats();
  for (const auto& [k, v] : after.Flatten()) {
    if (absl::EndsWith(k, ".allocated") || absl::EndsWith(k, ".freed")) {
      EXPECT_EQ(v, 0) << k;
    }
  }
  for (std::int64_t v : {after.num_alloc_retries, after.num_ooms, after.num_sync_all_streams,
                         after.num_device_alloc, after.num_device_free}) {
    EXPECT_EQ(v, 0);
  }
  EXPECT_EQ(after.allocated_bytes[kAllPools].current, before.allocated_bytes[kAllPools].current);
  EXPECT_EQ(after.allocated_bytes[kAllPools].peak, before.allocated_bytes[kAllPools].peak);
  EXPECT_EQ(after.reserved_bytes[kAllPools].current, before.reserved_bytes[kAllPools].current);
  ASSERT_TRUE(alloc_->Free(a).ok());
  EXPECT_EQ(Stats().allocation[kAllPools].freed, 1);
  ExpectInvariants();
}

}  // namespace
}  // namespace cma
