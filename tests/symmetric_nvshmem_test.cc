// The symmetric heap's NVSHMEM provider on the host backend's emulation of
// NVSHMEM (HostBackendOptions::shmem_*): caching with no NVSHMEM call on a
// hit, peers mapped or reached through Put/Get, the group shapes NVSHMEM
// cannot serve, members failing together before any of them enters one of
// NVSHMEM's blocking collectives, EmptyCache with caches that drifted apart,
// and bad Put/Get input refused with nothing copied. Real processes (fork)
// on real Unix sockets. The emulation fails (rather than hangs) when its
// collectives are entered by some members only or with different arguments,
// so each test that passes shows cma entered them together.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/symmetric_process_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

const SymmetricOptions kShmem = WithProvider(SymmetricProvider::kNvshmem);

absl::StatusOr<std::unique_ptr<SymmetricHeap>> OneProcess(Backend& b, int members,
                                                          SymmetricOptions o = kShmem) {
  SymmetricGroup g;
  g.world_size = members;
  for (int r = 0; r < members; ++r) {
    g.local_ranks.push_back(r);
    g.local_devices.push_back(r);
  }
  return SymmetricHeap::Create(b, g, MakeSingleProcessExchange(), o);
}

TEST(SymmetricNvshmemTest, OneProcessCachesAndGivesMemoryBackAtEmptyCache) {
  HostBackend b({.device_count = 1});
  auto heap = OneProcess(b, 1);
  ASSERT_TRUE(heap.ok()) << heap.status();
  EXPECT_EQ((*heap)->provider(), SymmetricProvider::kNvshmem);
  auto a = (*heap)->Allocate(100000);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->bytes, 100000u);
  EXPECT_EQ((*a)->stride % (64 << 10), 0u);
  EXPECT_TRUE((*a)->unreachable.empty());
  std::memset((*a)->peers[0], 7, (*a)->bytes);
  ASSERT_TRUE((*heap)->Free(*a).ok());
  const std::int64_t mallocs = b.CallCount("ShmemMalloc");
  auto hit = (*heap)->Allocate(100000);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(hit->allocation, a->allocation);
  EXPECT_EQ(b.CallCount("ShmemMalloc"), mallocs);  // a hit calls nothing of NVSHMEM's
  SymmetricStats st = (*heap)->GetStats();
  EXPECT_EQ(st.allocations, 2);
  EXPECT_EQ(st.cache_hits, 1);
  EXPECT_EQ(st.symmetric_bytes, static_cast<std::int64_t>((*a)->stride));
  ASSERT_TRUE((*heap)->Free(*hit).ok());
  EXPECT_EQ(b.LiveResources().shmem_allocations, 1);
  ASSERT_TRUE((*heap)->EmptyCache().ok());
  EXPECT_EQ(b.CallCount("ShmemFree"), 1);
  st = (*heap)->GetStats();
  EXPECT_EQ(st.symmetric_bytes, 0);
  EXPECT_EQ(st.cached_bytes, 0);
  EXPECT_TRUE((*heap)->Snapshot().empty());
  heap->reset();
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

// The destructor cannot free NVSHMEM memory (its free is collective): what
// was not emptied stays in NVSHMEM's heap, as the contract says.
TEST(SymmetricNvshmemTest, TheDestructorLeavesNvshmemMemoryToNvshmem) {
  HostBackend b({.device_count = 1});
  auto heap = OneProcess(b, 1);
  ASSERT_TRUE(heap.ok());
  auto a = (*heap)->Allocate(4096);
  ASSERT_TRUE(a.ok());
  heap->reset();
  HostResourceCounts c = b.LiveResources();
  EXPECT_EQ(c.shmem_allocations, 1);
  EXPECT_EQ(c.managed_allocations, 0);  // the pointer table is this process's: freed
}

TEST(SymmetricNvshmemTest, ShapesAndOptionsNvshmemCannotServeAreRefusedWithNothingInitialised) {
  HostBackend b({.device_count = 2});
  auto two = OneProcess(b, 2);
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(two.status().message(), HasSubstr("one member (PE) per process and one GPU per PE"));
  SymmetricOptions mc = kShmem;
  mc.multicast = true;
  auto multicast = OneProcess(b, 1, mc);
  EXPECT_EQ(multicast.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(multicast.status().message(), HasSubstr("options of the VMM provider"));
  SymmetricOptions bad = kShmem;
  bad.provider = static_cast<SymmetricProvider>(7);
  auto unknown = OneProcess(b, 1, bad);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown provider 7"));
  EXPECT_FALSE(b.ShmemQueryState()->initialized);
  EXPECT_EQ(b.CallCount("ShmemInit"), 0);
  // And a backend without NVSHMEM says so, naming itself.
  EXPECT_EQ(b.Backend::PeerCopy(nullptr, nullptr, 0, 0).code(), absl::StatusCode::kUnimplemented);
}

TEST(SymmetricNvshmemTest, BadPutAndGetAreRefusedAndCopyNothing) {
  HostBackend b({.device_count = 1});
  auto heap = OneProcess(b, 1);
  ASSERT_TRUE(heap.ok());
  auto a = (*heap)->Allocate(4096);
  ASSERT_TRUE(a.ok());
  std::memset((*a)->peers[0], 1, 4096);
  std::vector<char> src(8192, 9);
  const std::int64_t copies = b.CallCount("PeerCopy");
  struct Case {
    int rank;
    std::size_t offset, bytes;
    const void* src;
    const char* says;
  } cases[] = {
      {1, 0, 16, src.data(), "member 1 of a group of 1"},
      {-1, 0, 16, src.data(), "member -1"},
      {0, 4090, 16, src.data(), "past the allocation's 4096 bytes"},
      {0, 0, 4097, src.data(), "past the allocation's 4096 bytes"},
      {0, 16, ~std::size_t{0} - 8, src.data(), "past the allocation"},  // would wrap
      {0, 0, 16, nullptr, "null local pointer"},
  };
  for (const Case& c : cases) {
    absl::Status s = (*heap)->Put(*a, c.rank, c.offset, c.src, c.bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
  }
  EXPECT_EQ(b.CallCount("PeerCopy"), copies);
  EXPECT_EQ(static_cast<const char*>((*a)->peers[0])[4095], 1);
  // A good one goes through: mapped, so a plain copy.
  ASSERT_TRUE((*heap)->Put(*a, 0, 4000, src.data(), 96).ok());
  EXPECT_EQ(static_cast<const char*>((*a)->peers[0])[4095], 9);
  EXPECT_EQ(b.CallCount("PeerCopy"), copies + 1);
  EXPECT_EQ(b.CallCount("ShmemPut"), 0);
  // A stale handle is refused like a stale free.
  const SymmetricHandle stale = *a;
  ASSERT_TRUE((*heap)->Free(stale).ok());
  absl::Status s = (*heap)->Get(stale, 0, 0, src.data(), 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("get of an allocation that is not live"));
  ASSERT_TRUE((*heap)->EmptyCache().ok());
}

// Members of several processes: with every peer mapped, they write each
// other's buffers directly and Put is a plain copy; with none mapped
// (peers[r] null, `unreachable` says why), Put and Get go through NVSHMEM's
// put/get and still reach every member.
class NvshmemProcessTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(NvshmemProcessTest, EveryMemberReachesEveryOther) {
  const auto [world, unreachable] = GetParam();
  const std::string path = SocketPath(unreachable ? "shmem-far" : "shmem-near");
  auto codes = RunProcesses(world, [&, world = world, unreachable = unreachable](int r) {
    HostBackend host({.device_count = 1, .shmem_unreachable = unreachable});
    auto heap = ProcessHeap(host, path, r, world, kTimeout, kShmem);
    if (!heap) return false;
    auto a = heap->Allocate(1 << 20);
    if (!a.ok()) return false;
    const int next = (r + 1) % world, prev = (r + world - 1) % world;
    if (((*a)->peers[next] == nullptr) != (unreachable && next != r)) return false;
    if (unreachable && world > 1 && !absl::StrContains((*a)->unreachable, "Put and Get")) return false;
    const std::int32_t token = 1000 + r;
    if (!heap->Put(*a, next, 4 * r, &token, 4).ok()) return false;
    const bool through_nvshmem = host.CallCount("ShmemPut") == 1;
    if (through_nvshmem != unreachable) return false;
    if (!heap->EmptyCache().ok()) return false;  // a round: every member has written
    std::int32_t seen = 0;
    if (static_cast<const std::int32_t*>((*a)->peers[r])[prev] != 1000 + prev) return false;
    // And read back from the next member what this member put there.
    if (!heap->Get(*a, next, 4 * r, &seen, 4).ok() || seen != token) return false;
    if (!heap->Free(*a).ok() || !heap->EmptyCache().ok()) return false;
    heap.reset();
    return host.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

INSTANTIATE_TEST_SUITE_P(Worlds, NvshmemProcessTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()));

// Member 1's local step of a miss fails (its pointer table): the ready
// round tells member 0 before either enters nvshmem_malloc, so member 0
// fails at once (not after the emulation's 10 s), and the group goes on.
TEST(SymmetricNvshmemCollectiveTest, ALocalFailureKeepsEveryMemberOutOfNvshmemMalloc) {
  const std::string path = SocketPath("shmem-ready");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    FaultInjectingBackend faulty(host);
    auto heap = ProcessHeap(faulty, path, r, 2, kTimeout, kShmem);
    if (!heap) return false;
    if (r == 1) faulty.SetPlan({.kind = FaultKind::kAllocation, .fail_nth = 1});
    const absl::Time t0 = absl::Now();
    auto a = heap->Allocate(1 << 20);
    if (a.ok() || absl::Now() - t0 > absl::Seconds(2)) return false;
    if (r == 0 && !absl::StrContains(a.status().message(), "process 1 failed")) return false;
    if (host.CallCount("ShmemMalloc") != 0) return false;
    auto again = heap->Allocate(1 << 20);
    if (!again.ok() || host.CallCount("ShmemMalloc") != 1) return false;
    if (!heap->Free(*again).ok() || !heap->EmptyCache().ok()) return false;
    heap.reset();
    return host.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// NVSHMEM gives memory to some PEs and not to others (it does not say it
// can: a fault that joins the collective, then reports failure on member 1).
// Every member fails naming the member that failed; every later collective
// is refused at once (the members' state is unknown) rather than waited
// for; what NVSHMEM handed out stays in its heap, as the provider documents.
TEST(SymmetricNvshmemCollectiveTest, AMixedNvshmemMallocOutcomeFailsEveryMemberAndStopsTheHeap) {
  const std::string path = SocketPath("shmem-mixed");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    FaultInjectingBackend faulty(host);
    auto heap = ProcessHeap(faulty, path, r, 2, kTimeout, kShmem);
    if (!heap) return false;
    auto kept = heap->Allocate(4096);
    if (!kept.ok()) return false;
    if (r == 1) faulty.SetPlan({.kind = FaultKind::kShmemOutcome, .fail_nth = 1});
    auto a = heap->Allocate(1 << 20);
    if (a.ok() || a.status().code() != absl::StatusCode::kInternal ||
        !absl::StrContains(a.status().message(), "failed on members 1 ") ||
        !absl::StrContains(a.status().message(), "stays in NVSHMEM's heap")) {
      return false;
    }
    const absl::Time t0 = absl::Now();
    auto again = heap->Allocate(1 << 20);
    if (again.ok() || again.status().code() != absl::StatusCode::kFailedPrecondition ||
        absl::Now() - t0 > absl::Seconds(2)) {
      return false;
    }
    if (heap->EmptyCache().ok()) return false;  // a collective too: refused
    if (host.CallCount("ShmemMalloc") != 2) return false;
    heap.reset();
    // The first allocation and the stranded one: NVSHMEM frees only collectively.
    return host.LiveResources().shmem_allocations == 2;
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Caches that drifted apart (member 1 has not freed B yet): members agree
// on a new allocation instead of taking their own cached ones, EmptyCache
// frees only what every member has cached (the emulation fails on a free
// some member does not make), and the rest goes later.
TEST(SymmetricNvshmemCollectiveTest, EmptyCacheFreesTogetherOnlyWhatEveryMemberCached) {
  const std::string path = SocketPath("shmem-drift");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    auto heap = ProcessHeap(host, path, r, 2, kTimeout, kShmem);
    if (!heap) return false;
    auto x = heap->Allocate(4096);
    auto y = heap->Allocate(4096);
    if (!x.ok() || !y.ok() || !heap->Free(*x).ok()) return false;
    if (r == 0 && !heap->Free(*y).ok()) return false;
    auto z = heap->Allocate(4096);  // member 0 could take x or y, member 1 only x: x it is
    if (!z.ok() || z->allocation != x->allocation) return false;
    if (!heap->Free(*z).ok()) return false;
    if (!heap->EmptyCache().ok() || host.CallCount("ShmemFree") != 1) return false;
    if (r == 1 && !heap->Free(*y).ok()) return false;
    if (!heap->EmptyCache().ok() || host.CallCount("ShmemFree") != 2) return false;
    heap.reset();
    return host.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// NVSHMEM is initialised once per process: a later heap of another shape
// is refused on every member, naming the state it found.
TEST(SymmetricNvshmemCollectiveTest, NvshmemInitialisedAsAnotherShapeIsRefusedOnEveryMember) {
  const std::string path = SocketPath("shmem-shape");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    if (r == 0) {
      auto solo = OneProcess(host, 1);  // NVSHMEM as PE 0 of 1 in process 0
      if (!solo.ok()) return false;
    }
    SymmetricGroup g{2, {r}, {0}};
    auto x = MakeUnixSocketExchange(path, r, 2, kTimeout, Token());
    if (!x.ok()) return false;
    const absl::Time t0 = absl::Now();
    auto heap = SymmetricHeap::Create(host, g, std::move(*x), kShmem);
    return !heap.ok() && heap.status().code() == absl::StatusCode::kFailedPrecondition &&
           absl::StrContains(heap.status().message(), "as PE 0 of 1") &&
           absl::Now() - t0 < absl::Seconds(2);
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// The emulation itself: a member that enters an NVSHMEM collective alone
// is reported after the timeout (where NVSHMEM would hang), and members that
// allocate different sizes are named; cma's rounds are what keep both away.
TEST(SymmetricNvshmemEmulationTest, ACollectiveEnteredAloneOrWithAnotherSizeFails) {
  auto codes = RunProcesses(1, [&](int) {
    HostBackend pe0({.device_count = 1, .shmem_timeout_seconds = 0.2});
    HostBackend pe1({.device_count = 1, .shmem_timeout_seconds = 0.2});
    auto id = pe0.ShmemUniqueId();
    if (!id.ok()) return false;
    absl::Status s1;
    std::thread t([&] { s1 = pe1.ShmemInit(*id, 1, 2, 0); });
    absl::Status s0 = pe0.ShmemInit(*id, 0, 2, 0);
    t.join();
    if (!s0.ok() || !s1.ok()) return false;
    absl::StatusOr<void*> a1;
    std::thread u([&] { a1 = pe1.ShmemMalloc(8192); });
    absl::StatusOr<void*> a0 = pe0.ShmemMalloc(4096);
    u.join();
    if (a0.ok() || !absl::StrContains(a0.status().message(), "undefined behaviour")) return false;
    HostBackend lone({.device_count = 1, .shmem_timeout_seconds = 0.2});
    auto id2 = lone.ShmemUniqueId();
    absl::Status alone = lone.ShmemInit(*id2, 0, 2, 0);
    return alone.code() == absl::StatusCode::kDeadlineExceeded &&
           absl::StrContains(alone.message(), "would wait here forever");
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

}  // namespace
}  // namespace cma
