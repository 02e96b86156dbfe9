// The host pool's frees under stress, from an adversarial review
// (allocator/host_pool_release.cc): failures of the backend leave no leak and
// no block handed out under a running kernel; the trip home is ordered after
// every stream that used a block; pool contexts (CUDA graph captures) see no
// stream call; forgotten streams are never used again; a failed batch move
// changes nothing; the host's peaks reset.
#include <cstdio>
#include <cstring>
#include <vector>

#include "allocator/caching_managed_allocator.h"
#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"
#include "tests/test_util.h"

namespace cma {
namespace {

constexpr int kHost = CachingManagedAllocator::kHostDevice;
constexpr std::size_t kMiB = std::size_t{1} << 20;

// A segment or slab whose release fails stays cached (and counted), to be
// released by a later EmptyCache or the destructor.
TEST(HostPoolOrdering, AReleaseThatFailsKeepsTheSegmentCached) {
  HostBackend host({.device_count = 1});
  FaultInjectingBackend faulty(host);
  {
    auto a = CachingManagedAllocator::Create(faulty, "");
    ASSERT_TRUE(a.ok());
    auto p = (*a)->Allocate(3 * kMiB, kHost);
    auto q = (*a)->Allocate(1000, kHost);  // a slab
    ASSERT_TRUE(p.ok() && q.ok());
    ASSERT_TRUE((*a)->Free(*p).ok());
    ASSERT_TRUE((*a)->Free(*q).ok());
    faulty.SetPlan({.kind = FaultKind::kFree, .probability = 1.0});
    (void)(*a)->EmptyCache();  // both FreeManaged calls fail
    faulty.SetPlan({});
    EXPECT_TRUE((*a)->CheckInvariants().ok());
    EXPECT_EQ((*a)->GetHostStats().reserved_bytes.current, 6 * kMiB)  // 4 MiB and a slab
        << "the pool forgot segments it still holds";
    (void)(*a)->EmptyCache();  // a retry without faults
  }
  EXPECT_EQ(host.LiveResources().managed_allocations, 0) << "segments leaked";
}

// A free whose reuse cannot be ordered after a stream's kernel (no event,
// no wait) is refused: the block stays allocated, never handed out again
// under the kernel.
TEST(HostPoolOrdering, AFreeThatCannotBeOrderedIsRefusedAndTheBlockStaysAllocated) {
  HostBackend host({.device_count = 1, .manual_completion = true});
  FaultInjectingBackend faulty(host);
  auto a = CachingManagedAllocator::Create(faulty, "");
  ASSERT_TRUE(a.ok());
  Stream s = *host.CreateStream(0);
  void* p = *(*a)->Allocate(4 * kMiB, kHost);
  ASSERT_TRUE((*a)->RecordStream(p, s).ok());
  ASSERT_TRUE(host.EnqueueWork(s).ok());  // a kernel still reads p
  faulty.SetPlan({.kind = FaultKind::kAny, .probability = 1.0});
  absl::Status f = (*a)->Free(p);
  faulty.SetPlan({});
  auto q = (*a)->Allocate(4 * kMiB, kHost);
  ASSERT_TRUE(q.ok());
  EXPECT_GT(host.PendingWork(s), 0);
  EXPECT_FALSE(f.ok() && *q == p)
      << "free reported success without ordering against the stream, and the block was handed "
         "out again while the stream's kernel still uses it";
  EXPECT_TRUE(absl::IsUnavailable(f)) << f;
  EXPECT_NE(*q, p);
  ASSERT_TRUE(host.CompleteWork(s).ok());
  (void)(*a)->Free(*q);
  if (!f.ok()) (void)(*a)->Free(p);
  a->reset();
  (void)host.DestroyStream(s);
}

class HostPoolOrderingTest : public AllocatorTest {};

// A free left on a device sends its pages home on the last move's stream
// only after every other stream that used the block (record_stream).
TEST_F(HostPoolOrderingTest, TheTripHomeWaitsForEveryStreamThatUsedTheBlock) {
  Make({.device_count = 1, .manual_completion = true});
  Stream s1 = *backend_->CreateStream(0);
  Stream s2 = *backend_->CreateStream(0);
  auto* p = static_cast<unsigned char*>(Alloc(4 * kMiB, kHost));
  std::memset(p, 0x77, 4 * kMiB);
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s1).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1).ok());
  ASSERT_TRUE(alloc_->RecordStream(p, s2).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2).ok());  // a kernel on s2 still reads p
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Free(p).ok());
  bool discarded = false;
  for (const PlacementRecord& r : backend_->Records()) {
    if (r.op == PlacementRecord::Op::kDiscardAndPrefetch) discarded = true;
  }
  bool s1_waits_for_s2 = false;
  for (const StreamWaitRecord& w : backend_->Waits()) {
    if (w.stream == s1 && w.on == s2) s1_waits_for_s2 = true;
  }
  EXPECT_GT(backend_->PendingWork(s2), 0);
  EXPECT_TRUE(!discarded || s1_waits_for_s2)
      << "the pages were discarded on s1 while s2's kernel (record_stream) still reads them";
  ASSERT_TRUE(backend_->CompleteWork(s2).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1).ok());
  (void)alloc_->EmptyCache();
  ASSERT_TRUE(backend_->DestroyStream(s1).ok());
  ASSERT_TRUE(backend_->DestroyStream(s2).ok());
}

// The same through a mapped move: migrated on s1, then mapped on s2.
TEST_F(HostPoolOrderingTest, TheTripHomeWaitsForTheStreamOfAMappedMove) {
  Make({.device_count = 1, .manual_completion = true});
  Stream s1 = *backend_->CreateStream(0);
  Stream s2 = *backend_->CreateStream(0);
  void* p = Alloc(4 * kMiB, kHost);
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s1).ok());
  ASSERT_TRUE(backend_->CompleteWork(s1).ok());
  AllocationHints h;
  h.preferred_location = Location::Host();
  ASSERT_TRUE(alloc_->SetHints(p, h).ok());
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s2).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2).ok());
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Free(p).ok());
  bool discarded_on_s1 = false;
  for (const PlacementRecord& r : backend_->Records()) {
    if (r.op == PlacementRecord::Op::kDiscardAndPrefetch && r.stream == s1) discarded_on_s1 = true;
  }
  bool ordered = false;
  for (const StreamWaitRecord& w : backend_->Waits()) ordered |= (w.stream == s1 && w.on == s2);
  EXPECT_TRUE(!discarded_on_s1 || ordered) << "discard on s1 races with s2's kernel";
  ASSERT_TRUE(backend_->CompleteWork(s2).ok());
  (void)alloc_->EmptyCache();
  ASSERT_TRUE(backend_->DestroyStream(s1).ok());
  ASSERT_TRUE(backend_->DestroyStream(s2).ok());
}

// A batch move that a device group refuses leaves the host allocations
// where they were: the host group moves last.
TEST_F(HostPoolOrderingTest, AFailedBatchMoveLeavesTheHostAllocationsWhereTheyWere) {
  Make({.device_count = 2});
  Stream s0 = *backend_->CreateStream(0);
  void* h = Alloc(4 * kMiB, kHost);
  void* d1 = Alloc(4 * kMiB, 1);
  ASSERT_TRUE(alloc_->Move(h, Location::Device(0), s0).ok());
  const std::string before = Fingerprint(*alloc_);
  void* both[] = {h, d1};
  // s0 is device 0's stream: device 1 refuses it for a move to the host.
  absl::Status s = alloc_->MoveBatch(both, Location::Host(), s0);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(*alloc_->PlacedOnHost(h)) << "the failed batch moved the host allocation: " << s;
  EXPECT_TRUE(Fingerprint(*alloc_) == before) << "state changed by a failing call";
  ASSERT_TRUE(backend_->SynchronizeStream(s0).ok());
  ASSERT_TRUE(alloc_->Free(h).ok());
  ASSERT_TRUE(alloc_->Free(d1).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s0).ok());
  (void)alloc_->EmptyCache();
  ASSERT_TRUE(backend_->DestroyStream(s0).ok());
}

// The host pool's peaks reset with the host pool (cma_reset_peak_stats(-1)),
// not with a device's.
TEST_F(HostPoolOrderingTest, HostPeaksResetOnlyWithTheHostPool) {
  void* p = Alloc(8 * kMiB, kHost);
  ASSERT_TRUE(alloc_->Free(p).ok());
  for (int d = 0; d < alloc_->device_count(); ++d) ASSERT_TRUE(alloc_->ResetPeakStats(d).ok());
  EXPECT_EQ(alloc_->GetHostStats().allocated_bytes.peak, 8 * kMiB);  // a device's reset: not the host's
  alloc_->ResetHostPeakStats();
  EXPECT_EQ(alloc_->GetHostStats().allocated_bytes.peak, 0);
}

// Where the host's memory cannot be read, the host pool still serves.
TEST(HostPoolOrdering, WithoutTheHostsMemoryInfoTheHostPoolStillServes) {
  HostBackend host({.device_count = 1});
  FaultInjectingBackend faulty(host);
  faulty.SetPlan({.kind = FaultKind::kOther, .fail_nth = 1});  // GetHostMemInfo
  auto a = CachingManagedAllocator::Create(faulty, "");
  faulty.SetPlan({});
  if (!a.ok()) GTEST_SKIP() << "Create refused (acceptable): " << a.status();
  auto p = (*a)->Allocate(1000, kHost);
  EXPECT_TRUE(p.ok()) << p.status();
  if (p.ok()) (void)(*a)->Free(*p);
}

// While a pool context is open (a CUDA graph capture may be under way), a
// CPU tensor made or freed makes no stream, event or placement call: the free
// waits for the context's end.
using HostPoolQuietTest = MemPoolFixture;
TEST_F(HostPoolQuietTest, NoUncapturableCallWhileAPoolContextIsOpen) {
  void* p = Alloc(4 * kMiB, kHost);
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
  void* q = Alloc(4 * kMiB, kHost);
  ASSERT_TRUE(alloc_->Move(q, Location::Device(0), s2_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());  // pending on s2_
  backend_->SetCapturing(s1_, true);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, {1, 0}, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  void* r = Alloc(1000, kHost);  // a CPU tensor made during the capture
  const std::int64_t after_alloc = UncapturableCalls();
  ASSERT_TRUE(alloc_->Free(q).ok());  // a CPU tensor dies during the capture
  const std::int64_t after_free = UncapturableCalls();
  EXPECT_EQ(after_alloc, before) << "host Allocate queried events during a pool context";
  EXPECT_EQ(after_free, after_alloc) << "host Free made uncapturable calls during a pool context";
  backend_->SetCapturing(s1_, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, {1, 0}).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, {1, 0}).ok());
  ASSERT_TRUE(alloc_->Free(r).ok());
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
}

// A free deferred by a pool context still sends the block's pages home
// once the context ends, ordered as any free, before the block is reused.
TEST_F(HostPoolQuietTest, AFreeDeferredByAPoolContextSendsThePagesHomeAfterIt) {
  void* p = Alloc(4 * kMiB, kHost);
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // a kernel on the device still uses it
  EXPECT_EQ(alloc_->GetHostStats().device_resident_bytes.current, 4 * kMiB);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, {1, 0}, Only(s1_)).ok());
  const std::int64_t before = UncapturableCalls();
  ASSERT_TRUE(alloc_->Free(p).ok());
  EXPECT_EQ(UncapturableCalls(), before);
  EXPECT_EQ(alloc_->GetHostStats().device_resident_bytes.current, 0);
  EXPECT_EQ(alloc_->GetHostStats().pending_frees, 1);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, {1, 0}).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, {1, 0}).ok());
  backend_->ClearRecords();
  void* q = Alloc(4 * kMiB, kHost);  // the next allocation does the deferred work
  EXPECT_NE(q, p);
  bool went_home = false;
  for (const PlacementRecord& r : backend_->Records()) {
    went_home |= r.op == PlacementRecord::Op::kDiscardAndPrefetch && r.stream == s2_;
  }
  EXPECT_TRUE(went_home);
  EXPECT_EQ(backend_->PageLocation(p), kPageOnHost);
  ASSERT_TRUE(backend_->CompleteWork(s2_).ok());
  ASSERT_TRUE(alloc_->Free(q).ok());
  void* r = Alloc(4 * kMiB, kHost);
  EXPECT_TRUE(r == p || r == q);
  ASSERT_TRUE(alloc_->Free(r).ok());
  ExpectInvariants();
}

// ForgetStream ("waits for its work; cma never uses it again", called
// before a stream is destroyed) reaches the host pool: a host allocation
// moved on the stream goes home on the default stream when freed.
TEST_F(HostPoolOrderingTest, AForgottenStreamIsNeverUsedAgain) {
  Make({.device_count = 1});
  Stream s = *backend_->CreateStream(0);
  void* p = Alloc(4 * kMiB, kHost);
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s).ok());
  ASSERT_TRUE(alloc_->ForgetStream(s).ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
  backend_->ClearRecords();
  ASSERT_TRUE(alloc_->Free(p).ok());
  bool went_home = false;
  for (const PlacementRecord& r : backend_->Records()) {
    EXPECT_NE(r.stream, s) << "the free used the forgotten (destroyed) stream";
    went_home |= r.op == PlacementRecord::Op::kDiscardAndPrefetch && r.stream == kDefaultStream;
  }
  EXPECT_TRUE(went_home);
  HostPoolStats st = alloc_->GetHostStats();
  EXPECT_EQ(st.num_placement_errors, 0);
  EXPECT_EQ(st.num_sync_streams, 0);
}

}  // namespace
}  // namespace cma
