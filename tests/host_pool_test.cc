// The host pool (allocator/host_pool.h) through CachingManagedAllocator on
// the host backend: size classes, reuse with no driver call, moves to a GPU
// and back without a copy, frees that wait for the GPU, and bad input.
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
constexpr int kHost = CachingManagedAllocator::kHostDevice;
constexpr std::size_t kMiB = std::size_t{1} << 20;

class HostPoolTest : public AllocatorTest {
 protected:
  void* HostAlloc(std::size_t n) { return Alloc(n, kHost); }
  HostPoolStats HostStats() { return alloc_->GetHostStats(); }
  std::size_t DeviceUsed(int device = 0) {
    MemInfo m = *backend_->GetMemInfo(device);
    return m.total_bytes - m.free_bytes;
  }
};

TEST_F(HostPoolTest, SmallRequestsShareOneSlabAndCostNoDeviceMemory) {
  char* a = static_cast<char*>(HostAlloc(1000));
  char* b = static_cast<char*>(HostAlloc(1000));
  char* c = static_cast<char*>(HostAlloc(3000));
  std::memset(a, 1, 1000);
  std::memset(c, 3, 3000);
  EXPECT_EQ(b - a, 1024);  // one 1 KiB class, carved in address order
  HostPoolStats s = HostStats();
  EXPECT_EQ(s.segment.current, 2);  // a 1 KiB slab and a 4 KiB slab
  EXPECT_EQ(s.reserved_bytes.current, 2 * 2 * kMiB);
  EXPECT_EQ(s.allocated_bytes.current, 1024 + 1024 + 4096);
  EXPECT_EQ(s.requested_bytes.current, 5000);
  EXPECT_EQ(backend_->CallCount("ReserveManaged"), 2);
  EXPECT_EQ(DeviceUsed(), 0u);  // host memory: no device's
  EXPECT_EQ(Stats().allocation[kAllPools].current, 0);
  EXPECT_EQ(*alloc_->RequestedSize(c), 3000u);
  EXPECT_EQ(*alloc_->DeviceOf(c), kHost);
  EXPECT_TRUE(*alloc_->PlacedOnHost(c));
  for (void* p : {a, b, c}) ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(HostStats().allocated_bytes.current, 0);
}

TEST_F(HostPoolTest, LargeRequestsGetWholePagesAndReuseOnlyCloseFits) {
  void* a = HostAlloc(3 * kMiB);  // 4 MiB
  EXPECT_EQ(HostStats().reserved_bytes.current, 4 * kMiB);
  ASSERT_TRUE(alloc_->Free(a).ok());
  void* b = HostAlloc(4 * kMiB - 1);  // the same 4 MiB: reused
  EXPECT_EQ(b, a);
  void* c = HostAlloc(kMiB + 1);  // 2 MiB: a 4 MiB block would waste half
  ASSERT_TRUE(alloc_->Free(b).ok());
  void* d = HostAlloc(2 * kMiB);  // 4 MiB is free, but too large for 2 MiB
  EXPECT_NE(d, b);
  EXPECT_EQ(backend_->CallCount("ReserveManaged"), 3);
  for (void* p : {c, d}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(HostPoolTest, SteadyStateMakesNoBackendCall) {
  for (std::size_t n : {std::size_t{100}, std::size_t{70000}, 5 * kMiB}) {
    ASSERT_TRUE(alloc_->Free(HostAlloc(n)).ok());
  }
  const auto calls = backend_->TotalCalls();
  for (int i = 0; i < 1000; ++i) {
    for (std::size_t n : {std::size_t{100}, std::size_t{70000}, 5 * kMiB}) {
      void* p = HostAlloc(n);
      ASSERT_TRUE(alloc_->Free(p).ok());
    }
  }
  EXPECT_EQ(backend_->TotalCalls(), calls);
}

TEST_F(HostPoolTest, MoveToADeviceAndBackKeepsTheBytesAndTheAddress) {
  Stream s = *backend_->CreateStream(0);
  auto* p = static_cast<unsigned char*>(HostAlloc(6 * kMiB));
  for (std::size_t i = 0; i < 6 * kMiB; ++i) p[i] = static_cast<unsigned char>(i * 7);
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s).ok());
  EXPECT_EQ(backend_->PageLocation(p), 0);
  EXPECT_EQ(DeviceUsed(), 6 * kMiB);
  EXPECT_FALSE(*alloc_->PlacedOnHost(p));
  HostPoolStats st = HostStats();
  EXPECT_EQ(st.moves, 1);
  EXPECT_EQ(st.moved_bytes_to_device, 6 * kMiB);
  EXPECT_EQ(st.device_resident_bytes.current, 6 * kMiB);
  auto r = backend_->Records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, PlacementRecord::Op::kPrefetch);  // a move, not a copy
  EXPECT_EQ(r[0].stream, s);
  ASSERT_TRUE(alloc_->Move(p, Location::Host(), s).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s).ok());
  EXPECT_EQ(backend_->PageLocation(p), kPageOnHost);
  EXPECT_EQ(DeviceUsed(), 0u);
  for (std::size_t i = 0; i < 6 * kMiB; ++i) {
    ASSERT_EQ(p[i], static_cast<unsigned char>(i * 7)) << i;
  }
  EXPECT_EQ(HostStats().device_resident_bytes.current, 0);
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
}

TEST_F(HostPoolTest, AFreeLeftOnADeviceSendsThePagesHomeAndWaitsForTheGpu) {
  Make({.device_count = 1, .manual_completion = true});
  Stream s = *backend_->CreateStream(0);
  void* p = HostAlloc(4 * kMiB);
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s).ok());  // a kernel still reads it
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Free(p).ok());
  auto r = backend_->Records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].op, PlacementRecord::Op::kDiscardAndPrefetch);
  EXPECT_TRUE(r[0].location.is_host());
  EXPECT_EQ(r[0].stream, s);
  EXPECT_EQ(HostStats().pending_frees, 1);
  EXPECT_EQ(HostStats().returned_bytes, 4 * kMiB);
  // Not reusable until the GPU is done with it.
  void* q = HostAlloc(4 * kMiB);
  EXPECT_NE(q, p);
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(backend_->CompleteWork(s).ok());
  void* again = HostAlloc(4 * kMiB);
  EXPECT_TRUE(again == p || again == q);
  EXPECT_EQ(HostStats().pending_frees, 0);
  EXPECT_EQ(backend_->PageLocation(p), kPageOnHost);
  ASSERT_TRUE(alloc_->Free(again).ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
}

TEST_F(HostPoolTest, ASmallChunkIsNeverDiscardedWithItsNeighbours) {
  Stream s = *backend_->CreateStream(0);
  auto* a = static_cast<unsigned char*>(HostAlloc(4096));
  auto* b = static_cast<unsigned char*>(HostAlloc(4096));  // same slab, same page
  std::memset(b, 0x5a, 4096);
  ASSERT_TRUE(alloc_->Move(a, Location::Device(0), s, /*contents_dead=*/true).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s).ok());
  for (const PlacementRecord& r : backend_->Records()) {
    EXPECT_NE(r.op, PlacementRecord::Op::kDiscardAndPrefetch);
    EXPECT_NE(r.op, PlacementRecord::Op::kDiscard);
  }
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(b[i], 0x5a) << i;
  ASSERT_TRUE(alloc_->Free(b).ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
}

TEST_F(HostPoolTest, RecordStreamMakesAFreeWaitEvenWithoutAMove) {
  Make({.device_count = 1, .manual_completion = true});
  Stream s = *backend_->CreateStream(0);
  void* p = HostAlloc(1000);
  ASSERT_TRUE(alloc_->RecordStream(p, s).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(HostStats().pending_frees, 1);
  void* q = HostAlloc(1000);
  EXPECT_NE(q, p);
  ASSERT_TRUE(backend_->CompleteWork(s).ok());
  ASSERT_TRUE(alloc_->Free(q).ok());
  void* r = HostAlloc(1000);  // the lowest free chunk again: p's
  EXPECT_EQ(r, p);
  ASSERT_TRUE(alloc_->Free(r).ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
}

TEST_F(HostPoolTest, AnAllocationThatPrefersTheHostIsMappedForTheDeviceNotMigrated) {
  Make({.device_count = 2, .manual_completion = true});
  Stream s = *backend_->CreateStream(1);
  void* p = HostAlloc(4 * kMiB);
  AllocationHints hints;
  hints.preferred_location = Location::Host();
  ASSERT_TRUE(alloc_->SetHints(p, hints).ok());
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Move(p, Location::Device(1), s).ok());
  auto r = backend_->Records();
  ASSERT_EQ(r.size(), 1u);  // advice only: nothing migrates
  EXPECT_EQ(r[0].op, PlacementRecord::Op::kAdvise);
  EXPECT_EQ(r[0].advice, Advice::kSetAccessedBy);
  EXPECT_EQ(r[0].location, Location::Device(1));
  EXPECT_EQ(DeviceUsed(1), 0u);
  EXPECT_TRUE(*alloc_->PlacedOnHost(p));
  HostPoolStats st = HostStats();
  EXPECT_EQ(st.mapped_moves, 1);
  EXPECT_EQ(st.mapped_bytes, 4 * kMiB);
  EXPECT_EQ(st.moves, 0);
  ASSERT_TRUE(alloc_->Move(p, Location::Device(1), s).ok());  // mapped once is enough
  EXPECT_EQ(backend_->Records().size(), 1u);
  // The device's kernel still reads it when it is freed: the free waits;
  // the advice stays on the memory for the next owner.
  ASSERT_TRUE(backend_->EnqueueWork(s).ok());
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(HostStats().pending_frees, 1);
  EXPECT_TRUE(backend_->Records().empty());
  ASSERT_TRUE(backend_->CompleteWork(s).ok());
  // The next owner asking for the same (a DataLoader's next batch) and
  // mapping it again: no driver call at all.
  void* q = HostAlloc(4 * kMiB);
  EXPECT_EQ(q, p);
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->SetHints(q, hints).ok());
  ASSERT_TRUE(alloc_->Move(q, Location::Device(1), s).ok());
  EXPECT_TRUE(backend_->Records().empty());
  EXPECT_EQ(HostStats().mapped_moves, 3);
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(backend_->CompleteWork(s).ok());
  // An owner without advice that moves it: the old advice goes, the pages
  // migrate.
  void* third = HostAlloc(4 * kMiB);
  EXPECT_EQ(third, p);
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Move(third, Location::Device(1), s).ok());
  std::set<Advice> withdrawn;
  bool migrated = false;
  for (const PlacementRecord& rec : backend_->Records()) {
    if (rec.op == PlacementRecord::Op::kAdvise) withdrawn.insert(rec.advice);
    migrated |= rec.op == PlacementRecord::Op::kPrefetch;
  }
  EXPECT_EQ(withdrawn, (std::set<Advice>{Advice::kUnsetPreferredLocation,
                                         Advice::kUnsetAccessedBy}));
  EXPECT_TRUE(migrated);
  EXPECT_EQ(DeviceUsed(1), 4 * kMiB);
  ASSERT_TRUE(alloc_->Move(third, Location::Host(), s).ok());
  ASSERT_TRUE(alloc_->Free(third).ok());
  ASSERT_TRUE(backend_->CompleteWork(s).ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
}

TEST_F(HostPoolTest, AdviceForAChunkOfASharedSlabIsRefused) {
  void* p = HostAlloc(4096);
  AllocationHints hints;
  hints.preferred_location = Location::Host();
  const std::string before = Fingerprint(*alloc_);
  absl::Status s = alloc_->SetHints(p, hints);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("share pages"));
  hints.accessed_by = {7};
  EXPECT_TRUE(absl::IsInvalidArgument(alloc_->SetHints(p, hints)));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(HostPoolTest, EmptyCacheReleasesIdleSlabsAndSegmentsOnly) {
  void* live = HostAlloc(512);
  void* idle_chunk = HostAlloc(8192);
  void* idle_big = HostAlloc(3 * kMiB);
  ASSERT_TRUE(alloc_->Free(idle_chunk).ok());
  ASSERT_TRUE(alloc_->Free(idle_big).ok());
  EXPECT_EQ(HostStats().segment.current, 3);
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  HostPoolStats s = HostStats();
  EXPECT_EQ(s.segment.current, 1);  // the slab with a live chunk stays
  EXPECT_EQ(s.reserved_bytes.current, 2 * kMiB);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(live).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(HostStats().reserved_bytes.current, 0);
}

TEST_F(HostPoolTest, BadInputIsRefusedByNameAndChangesNothing) {
  Make({.device_count = 1, .host_available = 64 * kMiB, .host_total = 64 * kMiB});
  void* p = HostAlloc(1000);
  void* d = alloc_->Allocate(4096, 0).value();
  int local = 0;
  const std::string before = Fingerprint(*alloc_);
  auto zero = alloc_->Allocate(0, kHost);
  EXPECT_TRUE(absl::IsInvalidArgument(zero.status()));
  EXPECT_THAT(zero.status().message(), HasSubstr("0 bytes"));
  auto huge = alloc_->Allocate(65 * kMiB, kHost);
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status()));
  EXPECT_THAT(huge.status().message(), HasSubstr("budget"));
  auto overflow = alloc_->Allocate(~std::size_t{0}, kHost);
  EXPECT_TRUE(absl::IsInvalidArgument(overflow.status()));
  AllocationHints hints;
  EXPECT_TRUE(absl::IsInvalidArgument(alloc_->Allocate(64, kHost, kDefaultStream, &hints).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(alloc_->Free(&local)));
  EXPECT_TRUE(absl::IsInvalidArgument(alloc_->Free(static_cast<char*>(p) + 8)));
  absl::Status bad_move = alloc_->Move(p, Location::Device(3), kDefaultStream);
  EXPECT_TRUE(absl::IsInvalidArgument(bad_move));
  EXPECT_THAT(bad_move.message(), HasSubstr("device 3"));
  void* both[] = {d, p};
  for (int device : {-2, 1}) {  // a device pool's pointer and a batch of both
    absl::Status bad = alloc_->MoveBatch(both, Location::Device(device), kDefaultStream);
    EXPECT_TRUE(absl::IsInvalidArgument(bad));
    EXPECT_THAT(bad.message(), HasSubstr(absl::StrFormat("invalid device %d", device)));
    bad = alloc_->Move(d, Location::Device(device), kDefaultStream);
    EXPECT_TRUE(absl::IsInvalidArgument(bad));
  }
  EXPECT_EQ(Fingerprint(*alloc_), before);
  ASSERT_TRUE(alloc_->Free(d).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  absl::Status twice = alloc_->Free(p);
  EXPECT_TRUE(absl::IsInvalidArgument(twice));
  EXPECT_THAT(twice.message(), HasSubstr("double free of host allocation"));
  EXPECT_TRUE(absl::IsInvalidArgument(alloc_->RecordStream(p, kDefaultStream)));
}

TEST_F(HostPoolTest, PastItsBudgetTheHostPoolIsOutOfMemoryAndRecovers) {
  Make({.device_count = 1, .host_available = 16 * kMiB, .host_total = 16 * kMiB});
  void* a = HostAlloc(8 * kMiB);
  void* b = HostAlloc(6 * kMiB);
  auto c = alloc_->Allocate(4 * kMiB, kHost);
  ASSERT_TRUE(absl::IsResourceExhausted(c.status()));
  EXPECT_THAT(c.status().message(), HasSubstr("host pool"));
  EXPECT_EQ(HostStats().num_ooms, 1);
  ASSERT_TRUE(alloc_->Free(b).ok());
  void* d = HostAlloc(8 * kMiB);  // releases b's idle 6 MiB to fit
  EXPECT_NE(d, nullptr);
  EXPECT_EQ(HostStats().num_alloc_retries, 2);
  for (void* p : {a, d}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(HostPoolTest, EmptyCacheAndShutdownReleaseEverything) {
  HostAlloc(100);  // still live at teardown: the destructor releases it
  HostAlloc(3 * kMiB);
  ExpectInvariants();
}

TEST_F(HostPoolTest, ConcurrentHostAndDeviceTraffic) {
  Stream s = *backend_->CreateStream(0);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        const std::size_t n = 256u << ((i + t) % 14);
        auto h = alloc_->Allocate(n, kHost);
        auto d = alloc_->Allocate(n, 0, kDefaultStream);
        if (!h.ok() || !d.ok()) {
          ++failures;
          continue;
        }
        std::memset(*h, t, n);
        if (i % 5 == 0 && !alloc_->Move(*h, Location::Device(0), s).ok()) ++failures;
        if (!alloc_->Free(*h).ok() || !alloc_->Free(*d).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(backend_->SynchronizeStream(s).ok());
  ExpectInvariants();
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
}

}  // namespace
}  // namespace cma
