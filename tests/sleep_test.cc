// Sleep and wake through pinned host staging (allocator/staging.h) on the
// host backend, which really discards (zero-fills) pages and really copies:
// levels 1 and 2, the staging kept across cycles and reported, its bound,
// giving it back, the fallbacks to migrating, Move and Free while asleep.
#include <cstring>
#include <vector>

#include "backends/fault/fault_injecting_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using Op = PlacementRecord::Op;
constexpr std::size_t kMiB = std::size_t{1} << 20;

class SleepTest : public AllocatorTest {
 protected:
  void SetUp() override { Remake(""); }
  void Remake(const std::string& config, std::size_t pinned = std::size_t{1} << 30,
              bool pinned_back_to_back = false) {
    Make({.device_count = 1,
          .device_capacity = std::size_t{1} << 30,
          .manual_completion = true,
          .pinned_capacity = pinned,
          .pinned_back_to_back = pinned_back_to_back},
         config);
    s1_ = *backend_->CreateStream(0);
    backend_->ClearRecords();
  }
  void TearDown() override {
    AllocatorTest::TearDown();
    if (backend_) {
      EXPECT_EQ(backend_->LiveResources().pinned_allocations, 0);  // the staging went too
      backend_->DestroyStream(s1_).IgnoreError();
    }
  }
  // `bytes` of a pattern that differs per allocation and per byte.
  void* Filled(std::size_t bytes, unsigned char seed) {
    void* p = Alloc(bytes, 0, s1_);
    auto* c = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < bytes; ++i) c[i] = static_cast<unsigned char>(seed + i * 31 / 7);
    return p;
  }
  static bool Intact(void* p, std::size_t bytes, unsigned char seed) {
    auto* c = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < bytes; ++i) {
      if (c[i] != static_cast<unsigned char>(seed + i * 31 / 7)) return false;
    }
    return true;
  }
  static bool Zeros(void* p, std::size_t bytes) {
    auto* c = static_cast<unsigned char*>(p);
    for (std::size_t i = 0; i < bytes; ++i) {
      if (c[i] != 0) return false;
    }
    return true;
  }
  std::vector<PlacementRecord> Take(Op op) {
    std::vector<PlacementRecord> out;
    for (const PlacementRecord& r : backend_->Records()) {
      if (r.op == op) out.push_back(r);
    }
    return out;
  }
  std::int64_t DevicePopulated() {
    MemInfo m = *backend_->GetMemInfo(0);
    return static_cast<std::int64_t>(m.total_bytes - m.free_bytes);
  }
  std::int64_t Staging() { return Stats().host_staging_bytes[kAllPools].current; }
  Stream s1_ = 0;
};

TEST_F(SleepTest, LevelOneStagesKeptPagesDiscardsDisposableAndKeepsTheStaging) {
  void* weights = Filled(8 * kMiB, 1);        // four whole pages
  void* small = Filled(3000, 2);              // alone on its page: staged, the page discarded
  void* kv = Filled(6 * kMiB, 3);
  ASSERT_TRUE(alloc_->SetDisposable(kv, true).ok());
  backend_->ClearRecords();
  auto slept = alloc_->Sleep(0, s1_);  // level 1 is the default
  ASSERT_TRUE(slept.ok()) << slept.status();
  // The kept bytes (not whole pages: the small block's 3000 bytes, rounded
  // to its block, right after weights: one copy for both) were copied into
  // pinned staging, then their pages discarded: the device holds nothing.
  std::size_t copied = 0;
  for (const PlacementRecord& c : Take(Op::kCopy)) {
    EXPECT_EQ(c.src, static_cast<char*>(weights) + copied);
    copied += c.bytes;
  }
  EXPECT_GE(copied, 8 * kMiB + 3000);
  EXPECT_LE(copied, 8 * kMiB + 4096);
  EXPECT_EQ(Stats().sleep_staged_bytes, static_cast<std::int64_t>(copied));
  // No more than the kept state, rounded up to whole pinned pages.
  EXPECT_EQ(Staging(), 10 * kMiB);
  EXPECT_EQ(backend_->LiveResources().pinned_bytes, 10 * kMiB);
  EXPECT_EQ(DevicePopulated(), 0);
  EXPECT_EQ(backend_->PageLocation(weights), kPageUnpopulated);
  EXPECT_EQ(backend_->PageLocation(small), kPageUnpopulated);
  EXPECT_TRUE(Zeros(weights, 8 * kMiB));  // really gone from the pages
  EXPECT_TRUE(Zeros(small, 3000));
  // Copies before discards, in the sleep's stream order.
  auto records = backend_->Records();
  std::uint64_t last_copy = 0, first_discard = ~0ull;
  for (const PlacementRecord& r : records) {
    EXPECT_EQ(r.stream, s1_);
    if (r.op == Op::kCopy) last_copy = std::max(last_copy, r.seq);
    if (r.op == Op::kDiscard) first_discard = std::min(first_discard, r.seq);
  }
  EXPECT_LT(last_copy, first_discard);
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(weights, 8 * kMiB, 1));  // bit for bit, same address
  EXPECT_TRUE(Intact(small, 3000, 2));
  EXPECT_EQ(backend_->PageLocation(weights), 0);
  EXPECT_EQ(Stats().sleep_restored_bytes, static_cast<std::int64_t>(copied));
  EXPECT_EQ(Staging(), 10 * kMiB);  // kept for the next cycle
  // Every later cycle reuses it: no pinning at all.
  const std::int64_t pins = backend_->CallCount("AllocatePinnedHost");
  for (int cycle = 0; cycle < 3; ++cycle) {
    ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
    ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  }
  EXPECT_EQ(backend_->CallCount("AllocatePinnedHost"), pins);
  EXPECT_TRUE(Intact(weights, 8 * kMiB, 1));
  EXPECT_TRUE(Intact(small, 3000, 2));
  for (void* p : {weights, small, kv}) ASSERT_TRUE(alloc_->Free(p).ok());
}

// A first Sleep whose staging needs several 256 MiB chunks pins them on
// several threads (allocator/chunk_pinner.h) and copies into each as it
// comes; with the host's pinned memory short, what does not fit migrates and
// no chunk pinned past the shortage stays pinned.
class SleepManyChunksTest : public SleepTest {
 protected:
  // 520 MiB of state: three staging chunks (256 + 256 + 8 MiB). A byte
  // every 64 KiB tells allocations and offsets apart (cheap under sanitizers).
  std::vector<void*> State() {
    std::vector<void*> out;
    for (unsigned char seed : {10, 20, 30, 40}) {
      void* p = Alloc(130 * kMiB, 0, s1_);
      auto* c = static_cast<unsigned char*>(p);
      std::memset(c, seed, 130 * kMiB);
      for (std::size_t i = 0; i < 130 * kMiB; i += 64 << 10) c[i] = static_cast<unsigned char>(seed + i / (64 << 10));
      out.push_back(p);
    }
    return out;
  }
  static bool Same(const std::vector<void*>& state) {
    unsigned char seed = 10;
    for (void* p : state) {
      auto* c = static_cast<unsigned char*>(p);
      for (std::size_t i = 0; i < 130 * kMiB; i += 64 << 10) {
        if (c[i] != static_cast<unsigned char>(seed + i / (64 << 10)) || c[i + 1] != seed) return false;
      }
      seed = static_cast<unsigned char>(seed + 10);
    }
    return true;
  }
};

TEST_F(SleepManyChunksTest, AFirstSleepPinsEveryChunkItNeeds) {
  std::vector<void*> state = State();
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_EQ(backend_->CallCount("AllocatePinnedHost"), 3);
  EXPECT_EQ(Staging(), 520 * kMiB);
  EXPECT_EQ(backend_->LiveResources().pinned_bytes, 520 * kMiB);
  EXPECT_EQ(DevicePopulated(), 0);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Same(state));
  for (void* p : state) ASSERT_TRUE(alloc_->Free(p).ok());
  ExpectInvariants();
}

// Regression: staging chunks the host placed back to back. A part that
// runs from one chunk into the next was copied as one piece across both
// (merged with its neighbour), which the driver refuses: the first sleep
// migrated those parts and every later sleep, one batch, all of them.
TEST_F(SleepManyChunksTest, ChunksBackToBackAreCopiedChunkByChunk) {
  Remake("sleep_pin_threads:1", std::size_t{1} << 30, /*pinned_back_to_back=*/true);
  std::vector<void*> state = State();
  backend_->ClearRecords();
  for (int cycle = 0; cycle < 2; ++cycle) {
    SCOPED_TRACE(cycle);
    ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
    EXPECT_EQ(Stats().num_placement_errors, 0) << *alloc_->LastPlacementError(0);
    EXPECT_EQ(Stats().sleep_staged_bytes, (cycle + 1) * static_cast<std::int64_t>(520 * kMiB));
    EXPECT_TRUE(Take(Op::kPrefetch).empty()) << "nothing migrates";
    EXPECT_EQ(DevicePopulated(), 0);
    ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
    EXPECT_TRUE(Same(state));
    backend_->ClearRecords();
  }
  EXPECT_EQ(backend_->LiveResources().pinned_allocations, 3);
  for (void* p : state) ASSERT_TRUE(alloc_->Free(p).ok());
  ExpectInvariants();
}

TEST_F(SleepManyChunksTest, PinnedMemoryRunningOutMigratesTheRestAndKeepsNoSpareChunk) {
  Remake("", 300 * kMiB);  // the second chunk cannot be pinned (the third could)
  std::vector<void*> state = State();
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  // The chunks are pinned at once: whichever of the first two got the
  // memory, staging holds what was handed out before the first failure.
  EXPECT_LE(Staging(), 256 * kMiB);
  EXPECT_EQ(backend_->LiveResources().pinned_bytes, static_cast<std::size_t>(Staging()))
      << "a chunk pinned past the failure was kept";
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Same(state));
  for (void* p : state) ASSERT_TRUE(alloc_->Free(p).ok());
  ExpectInvariants();
}

// Review of issue 34's fix: a batch naming a staged allocation twice (tied
// weights) read the staged entry after the first mention had removed it.
TEST_F(SleepTest, AMoveNamingAStagedAllocationTwiceRestoresItOnce) {
  Remake("roundup_power2_divisions:4");
  void* a = Filled(5 * kMiB + 1, 3);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_GT(Staging(), 0);
  const std::vector<void*> twice = {a, a};
  ASSERT_TRUE(alloc_->MoveBatch(twice, Location::Host(), s1_).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_TRUE(Intact(a, 5 * kMiB + 1, 3));
  EXPECT_EQ(Stats().sleep_restored_bytes, static_cast<std::int64_t>(5 * kMiB + 1));
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  EXPECT_TRUE(Intact(a, 5 * kMiB + 1, 3));
  ASSERT_TRUE(alloc_->Free(a).ok());
  ExpectInvariants();
}

TEST_F(SleepTest, ReleaseIsRefusedWhileStagingHoldsContentsThenGivesItAllBack) {
  void* weights = Filled(4 * kMiB, 9);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  const std::string before = Fingerprint(*alloc_);
  auto refused = alloc_->ReleaseSleepStaging(0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("wake"), std::string::npos) << refused.status();
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_EQ(alloc_->ReleaseSleepStaging(3).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  auto released = alloc_->ReleaseSleepStaging(0);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, 4 * kMiB);
  EXPECT_EQ(Staging(), 0);
  EXPECT_EQ(Stats().host_staging_bytes[kAllPools].peak, 4 * kMiB);
  EXPECT_EQ(backend_->LiveResources().pinned_bytes, 0u);
  EXPECT_EQ(*alloc_->ReleaseSleepStaging(0), 0u);  // nothing left: no-op
  // The next sleep pins again and still keeps the data.
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(weights, 4 * kMiB, 9));
  ASSERT_TRUE(alloc_->Free(weights).ok());
}

TEST_F(SleepTest, LevelTwoKeepsOnlyWhatIsMarkedKeep) {
  void* weights = Filled(4 * kMiB, 4);
  void* state = Filled(4 * kMiB, 5);
  ASSERT_TRUE(alloc_->SetKeep(state, true).ok());
  EXPECT_EQ(alloc_->SetKeep(reinterpret_cast<void*>(0x10), true).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(alloc_->Sleep(0, s1_, SleepLevel::kDiscard).ok());
  EXPECT_EQ(Staging(), 4 * kMiB);  // the kept one only
  EXPECT_EQ(DevicePopulated(), 0);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(state, 4 * kMiB, 5));
  EXPECT_TRUE(Zeros(weights, 4 * kMiB));  // the user reloads these
  EXPECT_EQ(DevicePopulated(), 8 * kMiB);  // both usable again, in place
  for (void* p : {weights, state}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(SleepTest, BadLevelIsRefusedAndChangesNothing) {
  void* p = Filled(4 * kMiB, 6);
  backend_->ClearRecords();
  const std::string before = Fingerprint(*alloc_);
  auto s = alloc_->Sleep(0, s1_, static_cast<SleepLevel>(5));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("level 5"), std::string::npos) << s.status();
  EXPECT_EQ(Fingerprint(*alloc_), before);
  EXPECT_EQ(backend_->Records().size(), 0u);
  ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(SleepTest, TheBoundCapsStagingAndTheRestMigrates) {
  Remake("sleep_staging_max:6M");
  void* a = Filled(4 * kMiB, 1);
  void* b = Filled(4 * kMiB, 2);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_EQ(Staging(), 4 * kMiB);  // one fits under 6M, the other migrates
  auto prefetches = Take(Op::kPrefetch);
  ASSERT_FALSE(prefetches.empty());
  EXPECT_EQ(prefetches.back().location, Location::Host());
  EXPECT_EQ(backend_->PageLocation(b), kPageOnHost);
  EXPECT_TRUE(Intact(b, 4 * kMiB, 2));  // migrated: readable while asleep
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(a, 4 * kMiB, 1));
  EXPECT_TRUE(Intact(b, 4 * kMiB, 2));
  for (void* p : {a, b}) ASSERT_TRUE(alloc_->Free(p).ok());
  Remake("sleep_staging_max:0");  // staging off: the migrating path
  void* c = Filled(4 * kMiB, 3);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_EQ(Staging(), 0);
  EXPECT_EQ(backend_->CallCount("AllocatePinnedHost"), 0);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(c, 4 * kMiB, 3));
  ASSERT_TRUE(alloc_->Free(c).ok());
}

TEST_F(SleepTest, NoPinnedMemoryMeansMigratingNotFailing) {
  Remake("", /*pinned=*/6 * kMiB);  // less than the 8 MiB the sleep asks for
  void* a = Filled(4 * kMiB, 1);
  void* b = Filled(4 * kMiB, 2);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  EXPECT_EQ(Staging(), 0);
  EXPECT_EQ(backend_->PageLocation(a), kPageOnHost);
  EXPECT_EQ(Stats().num_placement_errors, 0);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(a, 4 * kMiB, 1));
  EXPECT_TRUE(Intact(b, 4 * kMiB, 2));
  for (void* p : {a, b}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(SleepTest, FailedCopiesFallBackToMigrating) {
  alloc_.reset();
  FaultInjectingBackend faulty(*backend_);
  auto made = CachingManagedAllocator::Create(faulty, "");
  ASSERT_TRUE(made.ok());
  auto& a = *made;
  void* p = *a->Allocate(4 * kMiB, 0, s1_);
  std::memset(p, 0x5a, 4 * kMiB);
  faulty.SetPlan({.kind = FaultKind::kCopy, .fail_nth = 1});
  EXPECT_EQ(*a->LastPlacementError(0), "");
  ASSERT_TRUE(a->Sleep(0, s1_).ok());
  EXPECT_EQ(faulty.Injected(), 1);
  EXPECT_EQ(backend_->PageLocation(p), kPageOnHost);  // migrated instead
  EXPECT_EQ(a->GetStats(0)->num_placement_errors, 1);
  EXPECT_THAT(*a->LastPlacementError(0),
              ::testing::HasSubstr("copies into the pinned staging failed (1 allocations "
                                   "migrate instead)"));
  EXPECT_FALSE(a->LastPlacementError(7).ok()) << "no device 7";
  ASSERT_TRUE(a->Wake(0, s1_).ok());
  EXPECT_EQ(static_cast<unsigned char*>(p)[4 * kMiB - 1], 0x5a);
  // One failed copy does not turn staging off: the next cycle stages.
  const std::int64_t staged = a->GetStats(0)->sleep_staged_bytes;
  ASSERT_TRUE(a->Sleep(0, s1_).ok());
  EXPECT_EQ(a->GetStats(0)->sleep_staged_bytes, staged + static_cast<std::int64_t>(4 * kMiB));
  EXPECT_EQ(backend_->PageLocation(p), kPageUnpopulated);
  ASSERT_TRUE(a->Wake(0, s1_).ok());
  EXPECT_EQ(static_cast<unsigned char*>(p)[4 * kMiB - 1], 0x5a);
  ASSERT_TRUE(a->Free(p).ok());
  a.reset();
}

// A Sleep that fails after its copies into the staging (here its discard
// fails; the fault backend's failures have no side effect) leaves the
// allocations where they were, so the user goes on writing them: neither
// the next Sleep/Wake cycle nor a Move may bring back the staging's stale
// copy over those writes.
TEST_F(SleepTest, FailedSleepForgetsWhatItStagedSoLaterWritesSurvive) {
  for (const FaultKind kind : {FaultKind::kDiscard, FaultKind::kPrefetch}) {
    SCOPED_TRACE(FaultKindName(kind));
    alloc_.reset();
    FaultInjectingBackend faulty(*backend_);
    auto made = CachingManagedAllocator::Create(faulty, "");
    ASSERT_TRUE(made.ok());
    auto& a = *made;
    void* p = *a->Allocate(4 * kMiB, 0, s1_);
    void* q = *a->Allocate(4 * kMiB, 0, s1_);
    void* small = *a->Allocate(3000, 0, s1_);
    std::memset(p, 0x11, 4 * kMiB);
    std::memset(q, 0x33, 4 * kMiB);
    std::memset(small, 0x44, 3000);
    // Placed on the host, it stays there: the sleep migrates it (a prefetch).
    ASSERT_TRUE(a->Move(small, Location::Host(), s1_).ok());
    faulty.SetPlan({.kind = kind, .fail_nth = 1});
    auto failed = a->Sleep(0, s1_);
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(faulty.Injected(), 1);
    faulty.SetPlan({});
    // Still awake as far as the user knows: new contents.
    std::memset(p, 0x22, 4 * kMiB);
    std::memset(q, 0x55, 4 * kMiB);
    ASSERT_TRUE(a->Move(q, Location::Host(), s1_).ok());
    EXPECT_EQ(static_cast<unsigned char*>(q)[0], 0x55);
    EXPECT_EQ(static_cast<unsigned char*>(q)[4 * kMiB - 1], 0x55);
    ASSERT_TRUE(a->Sleep(0, s1_).ok());
    ASSERT_TRUE(a->Wake(0, s1_).ok());
    EXPECT_EQ(static_cast<unsigned char*>(p)[0], 0x22);
    EXPECT_EQ(static_cast<unsigned char*>(p)[4 * kMiB - 1], 0x22);
    EXPECT_EQ(static_cast<unsigned char*>(q)[4 * kMiB - 1], 0x55);
    EXPECT_EQ(static_cast<unsigned char*>(small)[2999], 0x44);
    EXPECT_TRUE(a->CheckInvariants().ok()) << a->CheckInvariants();
    for (void* x : {p, q, small}) ASSERT_TRUE(a->Free(x).ok());
    a.reset();
  }
}

TEST_F(SleepTest, MoveWhileAsleepBringsStagedContentsAlong) {
  void* a = Filled(4 * kMiB, 7);
  void* b = Filled(4 * kMiB, 8);
  void* c = Filled(4 * kMiB, 9);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Move(a, Location::Host(), s1_).ok());
  EXPECT_EQ(backend_->PageLocation(a), kPageOnHost);
  EXPECT_TRUE(Intact(a, 4 * kMiB, 7));  // readable on the host now
  ASSERT_TRUE(alloc_->Move(b, Location::Device(0), s1_).ok());
  EXPECT_EQ(backend_->PageLocation(b), 0);
  EXPECT_TRUE(Intact(b, 4 * kMiB, 8));
  // Declared dead: nothing is copied back.
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Move(c, Location::Device(0), s1_, /*contents_dead=*/true).ok());
  EXPECT_TRUE(Take(Op::kCopy).empty());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(a, 4 * kMiB, 7));
  EXPECT_TRUE(Intact(b, 4 * kMiB, 8));
  for (void* p : {a, b, c}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(SleepTest, FreeWhileAsleepForgetsTheStagedContents) {
  void* a = Filled(4 * kMiB, 1);
  void* b = Filled(4 * kMiB, 2);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  // A new allocation in its place is not overwritten by the wake.
  void* again = Filled(4 * kMiB, 3);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(again, 4 * kMiB, 3));
  EXPECT_TRUE(Intact(b, 4 * kMiB, 2));
  for (void* p : {again, b}) ASSERT_TRUE(alloc_->Free(p).ok());
}

// A page an allocation shares with one that stays (here: placed on the
// host, so it migrates) keeps its place: only the allocation's bytes on
// it migrate; its own pages are staged and discarded.
TEST_F(SleepTest, AnEdgePageSharedWithABlockThatStaysIsNotDiscarded) {
  void* a = Filled(3 * kMiB, 1);
  void* h = Filled(3 * kMiB, 2);
  const auto lo = reinterpret_cast<std::uintptr_t>(a);
  ASSERT_EQ(reinterpret_cast<std::uintptr_t>(h), lo + 3 * kMiB) << "the arena packs them";
  const std::uintptr_t shared = (lo + 3 * kMiB) / kPageSize * kPageSize;
  ASSERT_TRUE(alloc_->Move(h, Location::Host(), s1_).ok());
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  for (const PlacementRecord& r : Take(Op::kDiscard)) {
    const auto at = reinterpret_cast<std::uintptr_t>(r.ptr);
    EXPECT_TRUE(at + r.bytes <= shared || at >= shared + kPageSize) << "discarded the shared page";
  }
  EXPECT_EQ(Stats().sleep_staged_bytes, static_cast<std::int64_t>(shared - lo));
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(a, 3 * kMiB, 1));
  EXPECT_TRUE(Intact(h, 3 * kMiB, 2));
  for (void* p : {a, h}) ASSERT_TRUE(alloc_->Free(p).ok());
}

// The page at an allocation's end, whose rest was free, went with it; an
// allocation made there while asleep is written at once. Neither a Move of
// the staged one nor the Wake may discard that page or copy over it.
TEST_F(SleepTest, AnAllocationMadeAsleepOnADiscardedEdgePageKeepsItsContents) {
  for (const bool move_first : {false, true}) {
    SCOPED_TRACE(move_first ? "move, then wake" : "wake");
    void* a = Filled(3 * kMiB, 1);
    ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
    EXPECT_EQ(Stats().sleep_staged_bytes % (3 * kMiB), 0);  // all of it, edge page included
    EXPECT_EQ(backend_->PageLocation(static_cast<char*>(a) + 2 * kMiB), kPageUnpopulated);
    void* c = Filled(512 * 1024, 5);
    ASSERT_EQ(c, static_cast<char*>(a) + 3 * kMiB) << "the arena's next block";
    if (move_first) {
      ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s1_).ok());
      EXPECT_TRUE(Intact(a, 3 * kMiB, 1));
      EXPECT_TRUE(Intact(c, 512 * 1024, 5));
    }
    ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
    EXPECT_TRUE(Intact(a, 3 * kMiB, 1));
    EXPECT_TRUE(Intact(c, 512 * 1024, 5));
    for (void* p : {a, c}) ASSERT_TRUE(alloc_->Free(p).ok());
    ASSERT_TRUE(alloc_->EmptyCache().ok());
  }
}

// A Wake drops only what the Sleep before it dropped (issue 34, item 1):
// disposable contents that no Sleep discarded survive it.
TEST_F(SleepTest, AWakeWithNoSleepBeforeItKeepsDisposableContents) {
  for (const char* config : {"", "prefetch:none", "prefetch:on_move"}) {
    SCOPED_TRACE(config);
    Remake(config);
    void* kv = Filled(6 * kMiB, 3);
    ASSERT_TRUE(alloc_->SetDisposable(kv, true).ok());
    ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
    EXPECT_TRUE(Intact(kv, 6 * kMiB, 3));
    EXPECT_TRUE(Take(Op::kDiscardAndPrefetch).empty());
    ASSERT_TRUE(alloc_->Free(kv).ok());
  }
}

TEST_F(SleepTest, ADisposableAllocationMadeAsleepInAPoolContextSurvivesTheWake) {
  void* weights = Filled(4 * kMiB, 1);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  const MemPoolId pool{7, 0};
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, nullptr).ok());
  void* kv = Filled(6 * kMiB, 3);  // first touch places it (no prefetch in a pool context)
  ASSERT_TRUE(alloc_->SetDisposable(kv, true).ok());
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(weights, 4 * kMiB, 1));
  EXPECT_TRUE(Intact(kv, 6 * kMiB, 3));
  for (void* p : {weights, kv}) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
}

// A Sleep dropped the disposable contents; a Move to the host populated the
// pages again and the caller wrote there: that is live data now.
TEST_F(SleepTest, WhatIsWrittenAfterAMoveOfADroppedAllocationSurvivesTheWake) {
  void* kv = Filled(6 * kMiB, 3);
  ASSERT_TRUE(alloc_->SetDisposable(kv, true).ok());
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(alloc_->Move(kv, Location::Host(), s1_).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  auto* c = static_cast<unsigned char*>(kv);
  for (std::size_t i = 0; i < 6 * kMiB; ++i) c[i] = static_cast<unsigned char>(9 + i * 31 / 7);
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  EXPECT_TRUE(Intact(kv, 6 * kMiB, 9));
  ASSERT_TRUE(alloc_->Free(kv).ok());
}

// The staging is freed when the allocator goes: after the copies out of it
// on every stream that read it, a Move's as well as the last Wake's (a
// registered chunk's unregistering waits for the current device only).
TEST_F(SleepTest, DestructionWaitsForEveryStreamThatReadTheStaging) {
  void* a = Filled(4 * kMiB, 1);
  const Stream s2 = *backend_->CreateStream(0);
  ASSERT_TRUE(alloc_->Sleep(0, s1_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2).ok());  // the move's copies queue behind this
  ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s2).ok());
  ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  alloc_.reset();
  auto idle = backend_->QueryStream(s2);
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_TRUE(*idle) << "the staging was freed before the move's copies out of it ran";
  ASSERT_TRUE(backend_->DestroyStream(s2).ok());
}

}  // namespace
}  // namespace cma
