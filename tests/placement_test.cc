// Placement policies on the host backend: the exact prefetch, advise and
// discard calls each policy makes, the zero-copy move, and their stats.
#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
using Op = PlacementRecord::Op;

class PlacementTest : public AllocatorTest {
 protected:
  void SetUp() override { Remake(""); }
  void Remake(const std::string& config) {
    Make({.device_count = 2, .device_capacity = std::size_t{1} << 30}, config);
    s_ = *backend_->CreateStream(0);
    backend_->ClearRecords();
  }
  void TearDown() override {
    AllocatorTest::TearDown();
    backend_->DestroyStream(s_).IgnoreError();
  }
  std::vector<PlacementRecord> Take() {
    auto r = backend_->Records();
    backend_->ClearRecords();
    return r;
  }
  Stream s_ = 0;
};

// A snapshot shows free neighbours as one block (queries.cc) with the
// placement the allocator's own merge gives them: the same before and after
// it coalesces them.
TEST_F(PlacementTest, MergedSnapshotBlockKeepsThePlacementAMergeGives) {
  void* a = Alloc(8 << 20, 0, s_);
  void* b = Alloc(8 << 20, 0, s_);
  void* guard = Alloc(8 << 20, 0, s_);
  ASSERT_EQ(static_cast<char*>(b), static_cast<char*>(a) + (8 << 20));
  ASSERT_TRUE(alloc_->Move(b, Location::Host(), s_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
  const auto block_at = [&](void* p) {
    for (const SegmentSnapshot& seg : alloc_->Snapshot()) {
      for (const BlockSnapshot& x : seg.blocks) {
        if (x.address == reinterpret_cast<std::uintptr_t>(p)) {
          return std::make_pair(x.location, x.size);
        }
      }
    }
    return std::make_pair(std::string("none"), std::size_t{0});
  };
  const auto before = block_at(a);
  EXPECT_EQ(before.first, "host");
  EXPECT_EQ(before.second, std::size_t{16} << 20);
  void* big = Alloc(100 << 20, 0, s_);  // a lookup that misses coalesces the free blocks
  EXPECT_EQ(block_at(a), before);
  ASSERT_TRUE(alloc_->Free(big).ok());
  ASSERT_TRUE(alloc_->Free(guard).ok());
}

TEST_F(PlacementTest, FreshSegmentIsPrefetchedWholeOnce) {
  void* a = Alloc(1000, 0, s_);
  auto r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kPrefetch);
  EXPECT_EQ(r[0].bytes, 2u << 20);  // the whole small segment: later blocks are placed too
  EXPECT_EQ(r[0].location, Location::Device(0));
  EXPECT_EQ(r[0].stream, s_);
  void* b = Alloc(5000, 0, s_);
  EXPECT_TRUE(Take().empty());
  EXPECT_EQ(Stats().prefetched_bytes_to_device, 2 << 20);
  for (void* p : {a, b}) alloc_->Free(p).IgnoreError();
}

TEST_F(PlacementTest, ReuseOnTheSameDeviceMakesNoCall) {
  void* a = Alloc(8 << 20, 0, s_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  Take();
  void* b = Alloc(8 << 20, 0, s_);
  EXPECT_EQ(b, a);
  EXPECT_TRUE(Take().empty());
  alloc_->Free(b).IgnoreError();
}

TEST_F(PlacementTest, ReuseAfterHostMoveDiscardsAndPrefetches) {
  void* a = Alloc(8 << 20, 0, s_);
  Take();
  ASSERT_TRUE(alloc_->Move(a, Location::Host(), s_).ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kPrefetch);
  EXPECT_TRUE(r[0].location.is_host());
  EXPECT_EQ(r[0].ptr, a);
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(8 << 20, 0, s_);
  ASSERT_EQ(b, a);
  r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kDiscardAndPrefetch);  // stale host data is not migrated back
  EXPECT_EQ(r[0].location, Location::Device(0));
  EXPECT_EQ(r[0].bytes, 8u << 20);
  DeviceStats s = Stats();
  EXPECT_EQ(s.moves, 1);
  EXPECT_EQ(s.prefetched_bytes_to_host, 8 << 20);
  EXPECT_EQ(s.discarded_bytes, 8 << 20);
  alloc_->Free(b).IgnoreError();
}

TEST_F(PlacementTest, MoveKeepsTheAddressAndRecordsTheLocation) {
  void* a = Alloc(4 << 20, 0, s_);
  ASSERT_TRUE(alloc_->Move(a, Location::Device(1), s_).ok());
  auto snap = alloc_->Snapshot();
  bool found = false;
  for (auto& seg : snap) {
    for (auto& b : seg.blocks) {
      if (b.address == reinterpret_cast<std::uintptr_t>(a)) {
        found = true;
        EXPECT_EQ(b.location, "device 1");
        EXPECT_EQ(b.state, "active_allocated");
      }
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(*alloc_->DeviceOf(a), 0);  // the block still belongs to device 0's pool
  // An explicit move always reaches the driver: kernels may have moved the
  // pages since, so the allocator's record is not trusted for live data.
  Take();
  ASSERT_TRUE(alloc_->Move(a, Location::Device(1), s_).ok());
  EXPECT_EQ(Take().size(), 1u);
  alloc_->Free(a).IgnoreError();
}

TEST_F(PlacementTest, MoveMayUseTheTargetDevicesStream) {
  void* a = Alloc(4 << 20, 0, s_);
  Stream on1 = *backend_->CreateStream(1);
  Take();
  ASSERT_TRUE(alloc_->Move(a, Location::Device(1), on1).ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].stream, on1);
  // Not for a move to the host or to the owner: the stream must be the owner's.
  EXPECT_THAT(alloc_->Move(a, Location::Host(), on1).message(), HasSubstr("invalid stream"));
  EXPECT_THAT(alloc_->Move(a, Location::Device(0), on1).message(), HasSubstr("invalid stream"));
  alloc_->Free(a).IgnoreError();
  backend_->DestroyStream(on1).IgnoreError();
}

TEST_F(PlacementTest, MoveWithDeadContentsDiscards) {
  void* a = Alloc(4 << 20, 0, s_);
  Take();
  ASSERT_TRUE(alloc_->Move(a, Location::Host(), s_, /*contents_dead=*/true).ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kDiscardAndPrefetch);
  alloc_->Free(a).IgnoreError();
}

TEST_F(PlacementTest, MoveBatchIsOneBatchCall) {
  std::vector<void*> ptrs;
  for (int i = 0; i < 3; ++i) ptrs.push_back(Alloc(3 << 20, 0, s_));
  Take();
  ASSERT_TRUE(alloc_->MoveBatch(ptrs, Location::Host(), s_).ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 3u);
  for (auto& rec : r) {
    EXPECT_TRUE(rec.batched);
    EXPECT_TRUE(rec.location.is_host());
  }
  EXPECT_EQ(backend_->CallCount("PrefetchBatch"), 1);
  EXPECT_EQ(Stats().moves, 3);
  for (void* p : ptrs) alloc_->Free(p).IgnoreError();
}

TEST_F(PlacementTest, BadMovesAreErrorsAndChangeNothing) {
  void* a = Alloc(4096, 0, s_);
  Take();
  const std::string before = Fingerprint(*alloc_);
  int local;
  EXPECT_THAT(alloc_->Move(&local, Location::Host(), s_).message(), HasSubstr("not an allocation"));
  EXPECT_THAT(alloc_->Move(a, Location::Device(7), s_).message(), HasSubstr("invalid device 7"));
  EXPECT_FALSE(alloc_->Move(a, Location::Host(), 31337).ok());
  void* both[] = {a, &local};
  EXPECT_FALSE(alloc_->MoveBatch(both, Location::Host(), s_).ok());
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_TRUE(Take().empty());
  alloc_->Free(a).IgnoreError();
}

TEST_F(PlacementTest, PrefetchNoneMakesNoCall) {
  Remake("prefetch:none");
  void* a = Alloc(8 << 20, 0, s_);
  EXPECT_TRUE(Take().empty());
  ASSERT_TRUE(alloc_->Move(a, Location::Host(), s_).ok());  // an explicit move still moves
  EXPECT_EQ(Take().size(), 1u);
  alloc_->Free(a).IgnoreError();
}

TEST(PlacementWithoutFaultMigrationTest, FirstTouchPoliciesAreRefusedNamingTheReason) {
  // A GPU whose managed memory does not migrate on fault (ROCm without
  // XNACK): pages left to the first touch would stay remote for good.
  HostBackendOptions options;
  options.page_fault_migration = false;
  HostBackend backend(options);
  for (const char* config : {"prefetch:none", "prefetch:on_move,segments:classic"}) {
    auto a = CachingManagedAllocator::Create(backend, config);
    ASSERT_FALSE(a.ok()) << config;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(a.status().message(),
                HasSubstr("device 0 of the host backend does not migrate managed memory on "
                          "page faults (emulated: no migration on fault); use prefetch:on_alloc"));
  }
  EXPECT_THAT(CachingManagedAllocator::Create(backend, "prefetch:none").status().message(),
              HasSubstr("prefetch:none leaves pages"));
  EXPECT_TRUE(backend.Records().empty());  // a refusal places nothing
  // The default populates every page with a prefetch and is accepted.
  auto ok = CachingManagedAllocator::Create(backend, "");
  ASSERT_TRUE(ok.ok()) << ok.status();
  void* p = *(*ok)->Allocate(4 << 20, 0);
  EXPECT_FALSE(backend.Records().empty());
  ASSERT_TRUE((*ok)->Free(p).ok());
}

TEST_F(PlacementTest, WithoutPrefetchTheLocationOfAReusedBlockIsUnknown) {
  Remake("prefetch:none");
  void* a = Alloc(8 << 20, 0, s_);
  ASSERT_TRUE(alloc_->Move(a, Location::Host(), s_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(8 << 20, 0, s_);  // its user may fault the pages anywhere
  ASSERT_EQ(b, a);
  for (auto& seg : alloc_->Snapshot()) {
    for (auto& blk : seg.blocks) {
      if (blk.address == reinterpret_cast<std::uintptr_t>(b)) EXPECT_EQ(blk.location, "unplaced");
    }
  }
  Take();
  ASSERT_TRUE(alloc_->Move(b, Location::Host(), s_).ok());  // so a move to host really moves
  EXPECT_EQ(Take().size(), 1u);
  alloc_->Free(b).IgnoreError();
}

TEST_F(PlacementTest, PrefetchOnMoveOnlyMovesOnRequest) {
  Remake("prefetch:on_move");
  void* a = Alloc(8 << 20, 0, s_);
  EXPECT_TRUE(Take().empty());
  ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s_).ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kPrefetch);
  alloc_->Free(a).IgnoreError();
}

TEST_F(PlacementTest, ConfigAdviceOnEveryNewSegment) {
  Remake("preferred_location:device,accessed_by:all,prefetch:none,segments:classic");
  void* a = Alloc(4096, 1);
  auto r = Take();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].advice, Advice::kSetPreferredLocation);
  EXPECT_EQ(r[0].location, Location::Device(1));
  EXPECT_EQ(r[1].advice, Advice::kSetAccessedBy);
  EXPECT_EQ(r[2].advice, Advice::kSetAccessedBy);
  EXPECT_EQ(r[1].bytes, 2u << 20);
  void* b = Alloc(4096, 1);  // same segment: no new advice
  EXPECT_TRUE(Take().empty());
  EXPECT_EQ(Stats(1).advise_calls, 3);
  for (void* p : {a, b}) alloc_->Free(p).IgnoreError();
}

TEST_F(PlacementTest, PreferredHostAdvice) {
  Remake("preferred_location:host,prefetch:none");
  void* a = Alloc(4096);
  auto r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].location.is_host());
  alloc_->Free(a).IgnoreError();
}

TEST_F(PlacementTest, HintsAreAppliedAndWithdrawnAtFree) {
  Remake("prefetch:none");
  AllocationHints h;
  h.read_mostly = true;
  h.accessed_by = {1};
  auto p = alloc_->Allocate(1 << 20, 0, s_, &h);
  ASSERT_TRUE(p.ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].advice, Advice::kSetReadMostly);
  EXPECT_EQ(r[1].advice, Advice::kSetAccessedBy);
  EXPECT_EQ(r[1].bytes, 1u << 20);
  EXPECT_TRUE(backend_->GetRangeAttributes(*p, 1 << 20)->read_mostly);
  ASSERT_TRUE(alloc_->Free(*p).ok());
  r = Take();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].advice, Advice::kUnsetReadMostly);
  EXPECT_EQ(r[1].advice, Advice::kUnsetAccessedBy);
  // The next user of the block inherits none of it.
  void* q = Alloc(1 << 20, 0, s_);
  EXPECT_EQ(q, *p);
  EXPECT_FALSE(backend_->GetRangeAttributes(q, 1 << 20)->read_mostly);
  alloc_->Free(q).IgnoreError();
}

TEST_F(PlacementTest, BadHintsAreRejectedBeforeAllocating) {
  AllocationHints h;
  h.accessed_by = {9};
  const std::string before = Fingerprint(*alloc_);
  auto p = alloc_->Allocate(4096, 0, s_, &h);
  EXPECT_THAT(p.status().message(), HasSubstr("accessed-by device 9"));
  h.accessed_by.clear();
  h.preferred_location = Location::Device(-3);
  EXPECT_FALSE(alloc_->Allocate(4096, 0, s_, &h).ok());
  EXPECT_EQ(Fingerprint(*alloc_), before);
}

TEST_F(PlacementTest, SetHintsReplacesAdvice) {
  void* a = Alloc(1 << 20, 0, s_);
  Take();
  AllocationHints h;
  h.preferred_location = Location::Host();
  ASSERT_TRUE(alloc_->SetHints(a, h).ok());
  h.preferred_location = Location::Device(1);
  ASSERT_TRUE(alloc_->SetHints(a, h).ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 3u);  // set host; unset; set device 1
  EXPECT_EQ(r[1].advice, Advice::kUnsetPreferredLocation);
  EXPECT_EQ(backend_->GetRangeAttributes(a, 1 << 20)->preferred_location, Location::Device(1));
  alloc_->Free(a).IgnoreError();
}

TEST_F(PlacementTest, DiscardOnFreeOnTheBlocksStream) {
  Remake("discard_on_free:1");
  void* a = Alloc(8 << 20, 0, s_);
  Take();
  ASSERT_TRUE(alloc_->Free(a).ok());
  auto r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kDiscard);
  EXPECT_EQ(r[0].stream, s_);
  EXPECT_EQ(r[0].bytes, 8u << 20);
  EXPECT_EQ(Stats().discarded_bytes, 8 << 20);
  // Discarded memory is populated again on the next use, not migrated.
  void* b = Alloc(8 << 20, 0, s_);
  r = Take();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kPrefetch);
  alloc_->Free(b).IgnoreError();
}

TEST_F(PlacementTest, DiscardWaitsForOtherStreams) {
  Make({.device_count = 1, .device_capacity = std::size_t{1} << 30, .manual_completion = true},
       "discard_on_free:1");
  s_ = *backend_->CreateStream(0);
  Stream other = *backend_->CreateStream(0);
  void* a = Alloc(8 << 20, 0, s_);
  ASSERT_TRUE(alloc_->RecordStream(a, other).ok());
  ASSERT_TRUE(backend_->EnqueueWork(other).ok());
  Take();
  ASSERT_TRUE(alloc_->Free(a).ok());
  EXPECT_TRUE(Take().empty());  // `other` may still read it: no discard yet
  ASSERT_TRUE(backend_->CompleteWork(other).ok());
  void* b = Alloc(8 << 20, 0, s_);  // processes the pending free
  auto r = Take();
  ASSERT_GE(r.size(), 1u);
  EXPECT_EQ(r[0].op, Op::kDiscard);
  alloc_->Free(b).IgnoreError();
  alloc_.reset();
  backend_->DestroyStream(other).IgnoreError();
}

TEST_F(PlacementTest, ReleaseThresholdReturnsIdleMemory) {
  Remake("release_threshold:0,segments:classic");
  void* a = Alloc(30 << 20, 0, s_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(backend_->LiveResources().managed_allocations, 0);
}

TEST_F(PlacementTest, GarbageCollectionThresholdKeepsReservedUnderTheMark) {
  Make({.device_count = 1, .device_capacity = 100 << 20},
       "garbage_collection_threshold:0.5,release_before_peak:0,segments:classic");
  void* a = Alloc(30 << 20);
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(40 << 20);  // 30 + 40 > 50: the idle 30 MiB go first
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 40 << 20);
  EXPECT_EQ(Stats().num_device_free, 1);
  alloc_->Free(b).IgnoreError();
}

TEST_F(PlacementTest, DefaultBudgetIsTheFreeMemoryAtTheDevicesFirstUse) {
  HostBackend b({.device_count = 2, .device_capacity = 1 << 30});
  auto a = CachingManagedAllocator::Create(b, "");
  ASSERT_TRUE(a.ok());
  // Nothing read from a device before its first use: reading free memory
  // makes a CUDA context, which a rank using one GPU of several must not
  // hold on the others.
  EXPECT_EQ(b.CallCount("GetMemInfo"), 0);
  EXPECT_EQ((*a)->GetStats(1)->managed_budget_bytes, 0);
  // An empty_cache then touches no device (torch.cuda.empty_cache in a rank).
  const std::int64_t calls = b.TotalCalls();
  EXPECT_TRUE((*a)->EmptyCache().ok());
  EXPECT_EQ(b.TotalCalls(), calls);
  void* other = *b.AllocateManaged(0, 256 << 20);  // someone else's memory
  auto big = (*a)->Allocate(800 << 20, 0);
  EXPECT_THAT(big.status().message(), HasSubstr("managed budget"));
  EXPECT_EQ((*a)->GetStats(0)->managed_budget_bytes, 768 << 20);
  EXPECT_GT(b.CallCount("GetMemInfo"), 0);
  EXPECT_TRUE((*a)->EmptyCache().ok());
  EXPECT_EQ((*a)->GetStats(1)->managed_budget_bytes, 0);  // device 1 still untouched
  a->reset();
  b.FreeManaged(other).IgnoreError();
}

}  // namespace
}  // namespace cma
