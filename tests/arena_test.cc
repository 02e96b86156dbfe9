// Arena mode (the default): pages populated on hand-out, idle pages
// discarded on the stream that last used them, reserved_bytes equal to the
// populated bytes that the host backend itself counts, the budget under
// churn, and the real PyTorch traces within their goals.
#include <random>

#include "absl/strings/str_cat.h"
#include "bench/replay.h"
#include "bench/trace.h"
#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
using Op = PlacementRecord::Op;
constexpr std::size_t kMiB = std::size_t{1} << 20;

class ArenaTest : public AllocatorTest {
 protected:
  void SetUp() override { Remake(""); }
  void Remake(const std::string& config, std::size_t capacity = std::size_t{1} << 30) {
    Make({.device_count = 2, .device_capacity = capacity, .manual_completion = true}, config);
    s1_ = *backend_->CreateStream(0);
    s2_ = *backend_->CreateStream(0);
    backend_->ClearRecords();
  }
  void TearDown() override {
    AllocatorTest::TearDown();
    backend_->DestroyStream(s1_).IgnoreError();
    backend_->DestroyStream(s2_).IgnoreError();
  }
  std::vector<PlacementRecord> Take(Op op) {
    std::vector<PlacementRecord> out;
    for (const PlacementRecord& r : backend_->Records()) {
      if (r.op == op) out.push_back(r);
    }
    backend_->ClearRecords();
    return out;
  }
  // Populated bytes as the host backend counts them (capacity - free).
  std::int64_t BackendPopulated(int device = 0) {
    MemInfo m = *backend_->GetMemInfo(device);
    return static_cast<std::int64_t>(m.total_bytes - m.free_bytes);
  }
  Stream s1_ = 0, s2_ = 0;
};

TEST_F(ArenaTest, ReservedCountsPopulatedPagesNotAddressSpace) {
  void* a = Alloc(3 * kMiB, 0, s1_);  // two 2 MiB pages
  DeviceStats s = Stats();
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 4 * kMiB);
  EXPECT_EQ(s.virtual_bytes, 1 << 30);  // one arena the size of the budget
  EXPECT_EQ(BackendPopulated(), 4 * kMiB);
  auto prefetches = Take(Op::kPrefetch);
  ASSERT_EQ(prefetches.size(), 1u);
  EXPECT_EQ(prefetches[0].bytes, 4 * kMiB);  // the fresh pages, whole
  EXPECT_EQ(prefetches[0].stream, s1_);
  // Small requests are carved from the same arena: these two fill the rest
  // of a's second page instead of populating a page of their own.
  void* b = Alloc(512 * 1024, 0, s1_);
  void* c = Alloc(kMiB / 2, 0, s1_);
  EXPECT_EQ(static_cast<char*>(b), static_cast<char*>(a) + 3 * kMiB);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 4 * kMiB);
  EXPECT_EQ(BackendPopulated(), 4 * kMiB);
  // The allocation statistics still tell the size classes apart.
  EXPECT_EQ(Stats().allocated_bytes[kSmallPool].current, static_cast<std::int64_t>(kMiB));
  EXPECT_EQ(Stats().allocated_bytes[kLargePool].current, static_cast<std::int64_t>(3 * kMiB));
  EXPECT_EQ(Stats().segment[kAllPools].current, 1);
  for (void* x : {a, b, c}) ASSERT_TRUE(alloc_->Free(x).ok());
  // Freeing gives nothing back by itself: the pages are cached, idle.
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 4 * kMiB);
  EXPECT_EQ(Stats().idle_populated_bytes, 4 * kMiB);
  EXPECT_EQ(Stats().allocated_bytes[kSmallPool].current, 0);
}

TEST_F(ArenaTest, SteadyStateMakesNoBackendCall) {
  for (std::size_t n : {std::size_t{700}, 3 * kMiB, 100 * kMiB}) {
    ASSERT_TRUE(alloc_->Free(Alloc(n, 0, s1_)).ok());
  }
  backend_->ClearRecords();
  const std::int64_t events = backend_->CallCount("RecordEvent");
  for (int i = 0; i < 100; ++i) {
    for (std::size_t n : {std::size_t{700}, 3 * kMiB, 100 * kMiB}) {
      ASSERT_TRUE(alloc_->Free(Alloc(n, 0, s1_)).ok());
    }
  }
  EXPECT_TRUE(backend_->Records().empty());
  EXPECT_EQ(backend_->CallCount("RecordEvent"), events);
  EXPECT_EQ(backend_->CallCount("ReserveManaged"), 1);  // one arena for every size
  EXPECT_EQ(Stats().num_pages_discarded, 0);
}

TEST_F(ArenaTest, NewPagesReplaceIdleOnesSoThePeakStaysAtTheLivePeak) {
  Remake("idle_page_slack:0");
  void* a = Alloc(8 * kMiB, 0, s1_);
  void* keep = Alloc(2 * kMiB, 0, s1_);  // pins the arena's middle
  ASSERT_TRUE(alloc_->Free(a).ok());     // 4 idle pages below `keep`
  backend_->ClearRecords();
  void* b = Alloc(10 * kMiB, 0, s1_);  // does not fit below: 5 fresh pages above
  DeviceStats s = Stats();
  // Four idle pages were discarded to make room for five new ones.
  EXPECT_EQ(s.num_pages_discarded, 4);
  EXPECT_EQ(s.reserved_bytes[kAllPools].current, 12 * kMiB);
  EXPECT_EQ(s.reserved_bytes[kAllPools].peak, 12 * kMiB);
  EXPECT_EQ(BackendPopulated(), 12 * kMiB);
  auto discards = Take(Op::kDiscard);
  ASSERT_EQ(discards.size(), 1u);
  EXPECT_EQ(discards[0].ptr, a);
  EXPECT_EQ(discards[0].bytes, 8 * kMiB);
  EXPECT_EQ(discards[0].stream, s1_);  // ordered after a's last use
  for (void* x : {keep, b}) ASSERT_TRUE(alloc_->Free(x).ok());
}

TEST_F(ArenaTest, PeakLiveDeviceBytesCountsLivePagesNotTheIdleCache) {
  // What the work needed of the device: live pages and their shared edges at
  // their most, whatever stays cached idle (oversubscription's planners read
  // it to tell how much more would fit).
  void* a = Alloc(3 * kMiB, 0, s1_);  // pages 0-1
  void* b = Alloc(3 * kMiB, 0, s1_);  // shares page 1, populates 2
  EXPECT_EQ(Stats().peak_live_device_bytes, static_cast<std::int64_t>(6 * kMiB));
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
  DeviceStats s = Stats();
  EXPECT_EQ(s.idle_populated_bytes, static_cast<std::int64_t>(6 * kMiB));
  EXPECT_EQ(s.peak_live_device_bytes, static_cast<std::int64_t>(6 * kMiB));
  EXPECT_EQ(s.Flatten().at("peak_live_device_bytes"), static_cast<std::int64_t>(6 * kMiB));
  // Reset, the peak is what is live now: nothing; reusing idle pages counts.
  ASSERT_TRUE(alloc_->ResetPeakStats(0).ok());
  EXPECT_EQ(Stats().peak_live_device_bytes, 0);
  void* c = Alloc(kMiB, 0, s1_);
  EXPECT_EQ(Stats().peak_live_device_bytes, static_cast<std::int64_t>(2 * kMiB));
  ASSERT_TRUE(alloc_->Free(c).ok());
}

TEST_F(ArenaTest, TakeLivePeakHasAWindowOfItsOwn) {
  void* a = Alloc(6 * kMiB, 0, s1_);
  void* b = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(b).ok());
  EXPECT_EQ(*alloc_->TakeLivePeak(0), 10 * kMiB);  // since the allocator began
  EXPECT_EQ(*alloc_->TakeLivePeak(0), 6 * kMiB);   // a new window starts at what is live
  // The user's reset of the peaks leaves the window alone, and the other way round.
  void* c = Alloc(8 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(c).ok());
  ASSERT_TRUE(alloc_->ResetPeakStats(0).ok());
  EXPECT_EQ(Stats().peak_live_device_bytes, static_cast<std::int64_t>(6 * kMiB));
  EXPECT_EQ(*alloc_->TakeLivePeak(0), 14 * kMiB);
  void* d = Alloc(2 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(d).ok());
  EXPECT_EQ(*alloc_->TakeLivePeak(0), 8 * kMiB);
  EXPECT_EQ(Stats().peak_live_device_bytes, static_cast<std::int64_t>(8 * kMiB));
  EXPECT_FALSE(alloc_->TakeLivePeak(7).ok());
  EXPECT_FALSE(alloc_->TakeLivePeak(-1).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(ArenaTest, DiscardIsOrderedOnTheStreamStillUsingThePage) {
  Remake("idle_page_slack:0");
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());  // a kernel still reads a
  ASSERT_TRUE(alloc_->Free(a).ok());
  backend_->ClearRecords();
  // s2 cannot take a's pages while s1 is busy; its new arena's pages replace
  // a's idle ones, discarded on s1 behind the kernel, not synchronously.
  void* b = Alloc(4 * kMiB, 0, s2_);
  EXPECT_NE(b, a);
  auto discards = Take(Op::kDiscard);
  ASSERT_EQ(discards.size(), 1u);
  EXPECT_EQ(discards[0].stream, s1_);
  EXPECT_EQ(backend_->PendingWork(s1_), 1);  // nobody waited for the kernel
  EXPECT_EQ(Stats().num_sync_all_streams, 0);
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
}

TEST_F(ArenaTest, IdleStreamsFreeBlocksMergeIntoOneHole) {
  void* a = Alloc(6 * kMiB, 0, s1_);  // pages 0-2
  void* b = Alloc(6 * kMiB, 0, s2_);  // pages 3-5: s2 adopts s1's idle tail
  ASSERT_EQ(static_cast<char*>(b) - static_cast<char*>(a), static_cast<long>(6 * kMiB));
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
  const DeviceStats before = Stats();
  const std::int64_t queries = backend_->CallCount("QueryStream");
  // Neither stream's hole holds 12 MiB; together they do, once s2 is idle.
  void* c = Alloc(12 * kMiB, 0, s1_);
  EXPECT_EQ(c, a);
  EXPECT_EQ(Stats().num_pages_populated, before.num_pages_populated);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].peak, before.reserved_bytes[kAllPools].peak);
  EXPECT_EQ(backend_->CallCount("QueryStream"), queries + 1);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(c).ok());
}

TEST_F(ArenaTest, BusyStreamsFreeBlocksStayTheirs) {
  void* a = Alloc(6 * kMiB, 0, s1_);
  void* b = Alloc(6 * kMiB, 0, s2_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // a kernel still reads b
  ASSERT_TRUE(alloc_->Free(b).ok());
  void* c = Alloc(12 * kMiB, 0, s1_);
  // Not over b: new pages instead, and nobody waited for the kernel.
  const auto lo = reinterpret_cast<std::uintptr_t>(c);
  const auto b_addr = reinterpret_cast<std::uintptr_t>(b);
  EXPECT_TRUE(lo + 12 * kMiB <= b_addr || lo >= b_addr + 6 * kMiB);
  EXPECT_EQ(backend_->PendingWork(s2_), 1);
  EXPECT_EQ(Stats().num_sync_all_streams, 0);
  ExpectInvariants();
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(c).ok());
}

TEST_F(ArenaTest, ABusyStreamsBlocksAreAdoptedOnceTheWorkBeforeTheirFreeIsDone) {
  // FSDP2's communication streams are rarely idle when asked: a block freed
  // on one must still serve another stream once the work queued before its
  // free has run, though newer work keeps the stream busy.
  void* a = Alloc(6 * kMiB, 0, s1_);
  void* b = Alloc(6 * kMiB, 0, s2_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // a kernel still reads b
  ASSERT_TRUE(alloc_->Free(b).ok());
  const std::int64_t records = backend_->CallCount("RecordEvent");
  void* c = Alloc(12 * kMiB, 0, s1_);  // s2 busy: new pages, and a mark on s2
  const auto lo = reinterpret_cast<std::uintptr_t>(c);
  const auto b_addr = reinterpret_cast<std::uintptr_t>(b);
  EXPECT_TRUE(lo + 12 * kMiB <= b_addr || lo >= b_addr + 6 * kMiB);
  EXPECT_EQ(backend_->CallCount("RecordEvent"), records + 1);
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());  // the kernel and the mark
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());   // s2 busy again with new work
  const DeviceStats before = Stats();
  // The same request: b is adopted and merges with a's hole.
  void* d = Alloc(12 * kMiB, 0, s1_);
  EXPECT_EQ(d, a);
  EXPECT_EQ(Stats().num_pages_populated, before.num_pages_populated);
  EXPECT_EQ(backend_->PendingWork(s2_), 1);  // nobody waited for s2's new work
  EXPECT_EQ(Stats().num_sync_all_streams, 0);
  ExpectInvariants();
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  for (void* x : {c, d}) ASSERT_TRUE(alloc_->Free(x).ok());
}

TEST_F(ArenaTest, ABusyStreamGetsAtMostTwoMarks) {
  void* a = Alloc(6 * kMiB, 0, s2_);
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  const std::int64_t records = backend_->CallCount("RecordEvent");
  std::vector<void*> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(Alloc(8 * kMiB, 0, s1_));  // s2's block cannot serve: asked, marked
    void* x = Alloc(2 * kMiB, 0, s2_);        // a new free on s2 each round
    ASSERT_TRUE(alloc_->Free(x).ok());
  }
  EXPECT_EQ(backend_->CallCount("RecordEvent"), records + 2);
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  for (void* x : held) ASSERT_TRUE(alloc_->Free(x).ok());
  ExpectInvariants();
}

TEST_F(ArenaTest, BlocksUnusedSinceTheirStreamWasIdleNeedNoQuery) {
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  const std::int64_t queries = backend_->CallCount("QueryStream");
  void* b = Alloc(2 * kMiB, 0, s2_);  // asks whether s1 is idle, adopts it all
  EXPECT_EQ(b, a);
  EXPECT_EQ(backend_->CallCount("QueryStream"), queries + 1);
  // The rest of a's pages went to s2 unused: s1 takes them back unasked.
  void* c = Alloc(2 * kMiB, 0, s1_);
  EXPECT_EQ(static_cast<char*>(c), static_cast<char*>(a) + 2 * kMiB);
  EXPECT_EQ(backend_->CallCount("QueryStream"), queries + 1);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 4 * kMiB);
  ExpectInvariants();
  for (void* x : {b, c}) ASSERT_TRUE(alloc_->Free(x).ok());
}

TEST_F(ArenaTest, LastFreedBlockKeepsEveryRuleOfThePool) {
  // The block a free just returned waits outside the pool's btree for the
  // next allocation of its size: it is still free, stream-bound and cached.
  void* a = Alloc(4 * kMiB, 0, s1_);
  ASSERT_TRUE(backend_->EnqueueWork(s1_).ok());  // a kernel still reads a
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(4 * kMiB, 0, s2_);
  EXPECT_NE(b, a);  // s1 is busy
  EXPECT_THAT(alloc_->Free(a).message(), HasSubstr("double free"));
  ExpectInvariants();
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  void* c = Alloc(4 * kMiB, 0, s1_);
  EXPECT_EQ(c, a);
  ASSERT_TRUE(alloc_->Free(c).ok());
  void* d = Alloc(2 * kMiB, 0, s1_);  // another size: from the pool, merged
  EXPECT_EQ(d, a);
  ExpectInvariants();
  for (void* x : {b, d}) ASSERT_TRUE(alloc_->Free(x).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(backend_->LiveResources().managed_allocations, 0);
}

TEST_F(ArenaTest, EmptyCacheReturnsIdlePagesAndArenas) {
  void* a = Alloc(kMiB, 0, s1_);
  void* x = Alloc(3 * kMiB / 2, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(x).ok());
  void* y = Alloc(3 * kMiB / 2, 0, s2_);  // s2's own arena
  ASSERT_TRUE(alloc_->RecordStream(y, s1_).ok());
  ASSERT_TRUE(alloc_->Free(y).ok());
  const std::int64_t before = Stats().reserved_bytes[kAllPools].current;
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  // Everything idle went, and with it the arenas.
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_GT(before, 0);
  EXPECT_EQ(backend_->LiveResources().managed_allocations, 0);
  EXPECT_EQ(BackendPopulated(), 0);
}

TEST_F(ArenaTest, MixedStreamPageSurvivesDiscard) {
  Remake("", 64 * kMiB);
  // Large blocks of two streams meet inside page 1 of one arena: s1 takes
  // [0, 3 MiB); s2 takes the rest of page 1 from the same arena once s1 is
  // idle (cross-stream reuse of the tail).
  void* a = Alloc(3 * kMiB, 0, s1_);
  void* b = Alloc(3 * kMiB, 0, s2_);  // cross-stream: s1 has no queued work
  ASSERT_EQ(static_cast<char*>(b) - static_cast<char*>(a), static_cast<long>(3 * kMiB));
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
  // Pages 0 (s1 only), 1 (s1 and s2), 2 (s2 only) are idle.
  EXPECT_EQ(Stats().idle_populated_bytes, 6 * kMiB);
  backend_->ClearRecords();
  // A budget below the idle pages asks for all of them.
  ASSERT_TRUE(alloc_->SetMemoryFraction(1.0 / 64, 0).ok());
  auto discards = Take(Op::kDiscard);
  ASSERT_EQ(discards.size(), 2u);
  for (const PlacementRecord& r : discards) EXPECT_EQ(r.bytes, 2 * kMiB);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 2 * kMiB);  // the shared page
  EXPECT_EQ(BackendPopulated(), 2 * kMiB);
}

// What PyTorch's test_graph_two_successive measures after earlier tests:
// empty_cache must leave no idle page behind, a page shared by free blocks
// of two streams included, or reserved bytes drop later when something else
// merges the streams' blocks.
TEST_F(ArenaTest, EmptyCacheDiscardsAPageSharedByTwoStreamsFreeBlocks) {
  Remake("", 64 * kMiB);
  void* a = Alloc(3 * kMiB, 0, s1_);
  void* b = Alloc(3 * kMiB, 0, s2_);  // page 1 holds the end of a and the start of b
  ASSERT_EQ(static_cast<char*>(b) - static_cast<char*>(a), static_cast<long>(3 * kMiB));
  void* live = Alloc(2 * kMiB, 0, s1_);  // keeps the arena from going back whole
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // s2 still has work queued
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
  EXPECT_EQ(Stats().idle_populated_bytes, 6 * kMiB);
  backend_->ClearRecords();
  const std::int64_t waits = backend_->CallCount("StreamWaitEvent");
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().idle_populated_bytes, 0);
  // s2, whose free block shares the page discarded on s1, reuses it only
  // after that discard (a GPU-side wait, not only the final host sync).
  EXPECT_EQ(backend_->CallCount("StreamWaitEvent") - waits, 1);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 2 * kMiB);  // `live`'s page alone
  EXPECT_EQ(BackendPopulated(), 2 * kMiB);
  // The shared page was discarded only after s2's queued work had run.
  EXPECT_EQ(backend_->PendingWork(s2_), 0);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(live).ok());
}

TEST_F(ArenaTest, BudgetCountsPopulatedBytesAndOomChangesNothing) {
  Remake("managed_budget:32M");
  void* a = Alloc(20 * kMiB, 0, s1_);
  const std::string before = Fingerprint(*alloc_);
  auto b = alloc_->Allocate(14 * kMiB, 0, s1_);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("managed budget"));
  EXPECT_THAT(b.status().message(), HasSubstr("num_ooms=1"));
  // Only the counters of the failed attempt moved.
  EXPECT_EQ(Stats().num_ooms, 1);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 20 * kMiB);
  EXPECT_EQ(backend_->LiveResources().managed_allocations, 1);
  ExpectInvariants();
  (void)before;
  void* c = Alloc(12 * kMiB, 0, s1_);  // exactly fits
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 32 * kMiB);
  for (void* x : {a, c}) ASSERT_TRUE(alloc_->Free(x).ok());
}

TEST_F(ArenaTest, OomRetryWaitsForPendingFreesAndReusesTheirPages) {
  Remake("", 64 * kMiB);
  void* a = Alloc(40 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->RecordStream(a, s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = Alloc(40 * kMiB, 0, s1_);  // waits for s2's kernel, then reuses a
  EXPECT_EQ(b, a);
  EXPECT_EQ(Stats().num_alloc_retries, 1);
  EXPECT_EQ(Stats().num_ooms, 0);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].peak, 40 * kMiB);
  EXPECT_EQ(backend_->LiveResources().managed_allocations, 1);  // the empty try went back
  ASSERT_TRUE(alloc_->Free(b).ok());
}

TEST_F(ArenaTest, DiscardOnFreeGivesWhollyFreePagesBack) {
  Remake("discard_on_free:1");
  void* a = Alloc(5 * kMiB, 0, s1_);  // pages 0-2; page 2 partly
  void* b = Alloc(kMiB + 512 * 1024, 0, s1_);  // shares page 2
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Free(a).ok());
  auto d = Take(Op::kDiscard);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].bytes, 4 * kMiB);  // pages 0 and 1 only: page 2 holds b too
  EXPECT_EQ(d[0].stream, s1_);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 4 * kMiB);  // pages 2 and 3
  // The same size again takes a's block back and populates what was
  // discarded (the last-freed shortcut must not assume its pages).
  backend_->ClearRecords();
  void* again = Alloc(5 * kMiB, 0, s1_);
  EXPECT_EQ(again, a);
  auto p = Take(Op::kPrefetch);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].bytes, 4 * kMiB);
  EXPECT_EQ(BackendPopulated(), 8 * kMiB);
  ExpectInvariants();
  for (void* x : {again, b}) ASSERT_TRUE(alloc_->Free(x).ok());
}

TEST_F(ArenaTest, LastFreedBlockIsRepopulatedAfterADiscard) {
  void* a = Alloc(8 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());  // waits, populated, for the same size
  ASSERT_TRUE(alloc_->SetMemoryFraction(1.0 / 1024, 0).ok());  // discards every idle page
  EXPECT_EQ(BackendPopulated(), 0);
  ASSERT_TRUE(alloc_->SetMemoryFraction(1.0, 0).ok());
  backend_->ClearRecords();
  void* b = Alloc(8 * kMiB, 0, s1_);
  EXPECT_EQ(b, a);
  EXPECT_EQ(Take(Op::kPrefetch).size(), 1u);
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 8 * kMiB);
  EXPECT_EQ(BackendPopulated(), 8 * kMiB);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(b).ok());
}

TEST_F(ArenaTest, SetBudgetBelowPopulatedDiscardsIdlePages) {
  void* a = Alloc(16 * kMiB, 0, s1_);
  void* b = Alloc(16 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->SetMemoryFraction(20.0 * kMiB / (1 << 30), 0).ok());
  EXPECT_LE(Stats().reserved_bytes[kAllPools].current, 20 * kMiB);
  EXPECT_EQ(BackendPopulated(), Stats().reserved_bytes[kAllPools].current);
  ASSERT_TRUE(alloc_->Free(b).ok());
}

TEST_F(ArenaTest, BudgetHoldsUnderChurnOnTwoStreams) {
  Remake("managed_budget:96M", 256 * kMiB);
  std::mt19937_64 rng(7);
  std::vector<std::pair<void*, Stream>> live;
  std::int64_t ooms = 0;
  for (int step = 0; step < 4000; ++step) {
    const Stream s = rng() % 2 ? s1_ : s2_;
    if (live.size() < 12 && rng() % 3 != 0) {
      const std::size_t n = std::size_t{512} << (rng() % 15);  // 512 B .. 8 MiB
      auto p = alloc_->Allocate(n + rng() % 4096, 0, s);
      if (p.ok()) {
        live.push_back({*p, s});
      } else {
        ASSERT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
        ++ooms;
      }
    } else if (!live.empty()) {
      const std::size_t i = rng() % live.size();
      if (rng() % 4 == 0) ASSERT_TRUE(backend_->EnqueueWork(live[i].second).ok());
      if (rng() % 5 == 0) ASSERT_TRUE(alloc_->RecordStream(live[i].first, s).ok());
      ASSERT_TRUE(alloc_->Free(live[i].first).ok());
      live.erase(live.begin() + static_cast<long>(i));
    }
    if (rng() % 7 == 0) ASSERT_TRUE(backend_->CompleteWork(rng() % 2 ? s1_ : s2_).ok());
    const DeviceStats st = Stats();
    ASSERT_LE(st.reserved_bytes[kAllPools].current, 96 * kMiB);
    ASSERT_EQ(BackendPopulated(), st.reserved_bytes[kAllPools].current) << "step " << step;
    if (step % 50 == 0) ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
  }
  for (auto& [p, s] : live) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1_).ok());
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  EXPECT_EQ(ooms, Stats().num_ooms);
}

TEST_F(ArenaTest, SleepMovesEverythingOutAndWakeBringsItBack) {
  void* weights = Alloc(8 * kMiB, 0, s1_);
  void* kv = Alloc(6 * kMiB, 0, s1_);
  void* idle = Alloc(4 * kMiB, 0, s1_);
  static_cast<char*>(weights)[123] = 7;
  ASSERT_TRUE(alloc_->Free(idle).ok());
  ASSERT_TRUE(alloc_->SetDisposable(kv, true).ok());
  backend_->ClearRecords();
  // The migrating path (sleep_test.cc tests the staging one).
  auto slept = alloc_->Sleep(0, s1_, SleepLevel::kMigrate);
  ASSERT_TRUE(slept.ok()) << slept.status();
  EXPECT_EQ(*slept, 14 * kMiB);
  // One batch each: the live data to the host, the disposable discarded, and
  // the idle cache given back; nothing of this allocator left on the device.
  auto prefetches = Take(Op::kPrefetch);
  ASSERT_EQ(prefetches.size(), 1u);
  EXPECT_EQ(prefetches[0].location, Location::Host());
  EXPECT_EQ(prefetches[0].ptr, weights);
  EXPECT_EQ(BackendPopulated(), 0);
  EXPECT_EQ(Stats().num_sync_all_streams, 0);
  auto woken = alloc_->Wake(0, s1_);
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(*woken, 14 * kMiB);
  EXPECT_EQ(static_cast<char*>(weights)[123], 7);  // same address, same data
  EXPECT_EQ(BackendPopulated(), 14 * kMiB);
  for (void* x : {weights, kv}) ASSERT_TRUE(alloc_->Free(x).ok());
  // Bad input changes nothing.
  EXPECT_EQ(alloc_->SetDisposable(kv, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->Sleep(7, s1_).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ArenaTest, RealTracesStayWithinTheirGoals) {
  // Goals from the arena issue, and the ratios PyTorch itself reached on
  // these traces (expandable segments: 1.021, 1.227 and, on the BERT loop's
  // trace, 1.115).
  struct Case {
    const char* trace;
    const char* config;
    double goal;
  };
  for (const Case& c : {Case{"bench/traces/resnet50_train.csv.gz", "", 1.03},
                        Case{"bench/traces/kvcache_two_streams.csv.gz", "", 1.10},
                        Case{"bench/traces/resnet50_train.csv.gz", "idle_page_slack:0.02", 1.03},
                        Case{"bench/traces/kvcache_two_streams.csv.gz", "idle_page_slack:0.02",
                             1.10},
                        Case{"bench/traces/bert_train.csv.gz", "", 1.105}}) {
    SCOPED_TRACE(absl::StrCat(c.trace, " ", c.config));
    auto ops = ReadTrace(c.trace);
    ASSERT_TRUE(ops.ok()) << ops.status();
    Make({.device_capacity = std::size_t{16} << 30}, c.config);
    auto r = Replay(*alloc_, 0, *ops, c.trace);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->ooms, 0);
    EXPECT_LE(r->ratio, c.goal);
    EXPECT_GE(r->ratio, 1.0);
    ExpectInvariants();
  }
}

TEST_F(ArenaTest, RealTracesStayWithinTheirGoalsWhenStreamsAreOftenBusy) {
  // Streams that are idle at some queries and not at others (a GPU's): with
  // adoption by stream idleness alone, each stream populated new pages
  // while the other held its blocks (kvcache 1.60-2.21, FSDP2 1.35-1.56).
  struct Case {
    const char* trace;
    double goal;
  };
  for (int busy : {25, 50, 75}) {
    for (const Case& c : {Case{"bench/traces/kvcache_two_streams.csv.gz", 1.30},
                          Case{"bench/traces/fsdp2_gpt2_two_gpus.csv.gz", 1.25}}) {
      SCOPED_TRACE(absl::StrCat(c.trace, " busy ", busy, "%"));
      auto ops = ReadTrace(c.trace);
      ASSERT_TRUE(ops.ok()) << ops.status();
      Make({.device_capacity = std::size_t{16} << 30, .busy_query_percent = busy}, "");
      auto r = Replay(*alloc_, 0, *ops, c.trace);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->ooms, 0);
      EXPECT_LE(r->ratio, c.goal);
      ExpectInvariants();
    }
  }
}

}  // namespace
}  // namespace cma
