// Symmetric mode on the host backend: memfd handles mapped into several real
// processes (fork), peer writes visible to every member, make_symmetric,
// collective free and reuse from cache, a member dying mid-rendezvous,
// mismatched sizes, the exchange transports and the multicast guard.
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "tests/symmetric_process_util.h"
#include "backends/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<SymmetricHeap> SingleProcessHeap(HostBackend& b, int members,
                                                 SymmetricOptions o = {}) {
  SymmetricGroup g;
  g.world_size = members;
  for (int r = 0; r < members; ++r) {
    g.local_ranks.push_back(r);
    g.local_devices.push_back(r);
  }
  auto h = SymmetricHeap::Create(b, g, MakeSingleProcessExchange(), o);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : nullptr;
}

// ---------------------------------------------------------------- one process

TEST(SymmetricHeapTest, FourDevicesInOneProcess) {
  HostBackend b({.device_count = 4});
  auto heap = SingleProcessHeap(b, 4);
  auto a = heap->Allocate(3 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  const SymmetricAllocation& s = **a;
  ASSERT_EQ(s.peers.size(), 4u);
  EXPECT_EQ(s.stride, 4u << 20);  // 3 MiB + signals, rounded to the 2 MiB granularity
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(static_cast<char*>(s.peers[r]), static_cast<char*>(s.base) + r * s.stride);
    EXPECT_EQ(static_cast<void**>(s.device_peers)[r], s.peers[r]);
    // The signal area closes the stride: 3 MiB of buffer, then room to spare.
    EXPECT_EQ(static_cast<char*>(s.signals[r]), static_cast<char*>(s.peers[r]) + s.stride - 256);
    std::memset(s.peers[r], r + 1, 3 << 20);  // every buffer writable
    std::memset(s.signals[r], 0, 256);
  }
  EXPECT_EQ(static_cast<char*>(s.peers[2])[12345], 3);
  EXPECT_EQ(heap->GetStats().symmetric_bytes, 4 * (4 << 20));
  EXPECT_EQ(b.CallCount("VmmSetAccess"), 1);  // one call with every device's access
  ASSERT_TRUE(heap->Free(*a).ok());
  heap.reset();
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});  // nothing leaks
}

TEST(SymmetricHeapTest, CacheHitMakesNoBackendCallAndNoExchangeInOneProcess) {
  HostBackend b({.device_count = 2});
  auto heap = SingleProcessHeap(b, 2);
  auto a = heap->Allocate(1 << 20);
  ASSERT_TRUE(a.ok());
  const void* base = (*a)->base;
  ASSERT_TRUE(heap->Free(*a).ok());
  EXPECT_EQ(heap->GetStats().cached_bytes, 2 * (2 << 20));
  const auto calls = b.TotalCalls();
  const auto exchanges = heap->GetStats().exchanges;
  for (int i = 0; i < 100; ++i) {
    auto again = heap->Allocate(1 << 20);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ((*again)->base, base);
    ASSERT_TRUE(heap->Free(*again).ok());
  }
  EXPECT_EQ(b.TotalCalls(), calls);
  // Every member is in this process: nothing to agree on with anyone
  // (across processes, a hit is one small round: symmetric_collective_test).
  EXPECT_EQ(heap->GetStats().exchanges, exchanges);
  EXPECT_EQ(heap->GetStats().cache_hits, 100);
  ASSERT_TRUE(heap->EmptyCache().ok());
  EXPECT_EQ(heap->GetStats().symmetric_bytes, 0);
  EXPECT_EQ(b.LiveResources().mappings, 0);
}

TEST(SymmetricHeapTest, SizesInOneGranuleShareCachedSegments) {
  HostBackend b({.device_count = 2});
  auto heap = SingleProcessHeap(b, 2);
  auto a = heap->Allocate(1000);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(heap->Free(*a).ok());
  auto c = heap->Allocate(5000);  // same 2 MiB stride: reused, with its new size
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->bytes, 5000u);
  EXPECT_EQ(heap->GetStats().cache_hits, 1);
  auto d = heap->Allocate(3 << 20);  // another stride: a new segment
  ASSERT_TRUE(d.ok());
  EXPECT_NE((*d)->base, (*c)->base);
}

// A cached allocation reused for a larger request of the same stride keeps
// its signal areas clear of every buffer (they once sat right after the
// first request's bytes, inside the second's).
TEST(SymmetricHeapTest, SignalAreasStayClearOfTheBufferWhenReusedLarger) {
  HostBackend b({.device_count = 2});
  auto heap = SingleProcessHeap(b, 2);
  auto small = heap->Allocate(1000);
  ASSERT_TRUE(small.ok());
  const std::vector<void*> signals = (*small)->signals;
  ASSERT_TRUE(heap->Free(*small).ok());
  auto large = heap->Allocate(1 << 20);  // same 2 MiB stride: a hit
  ASSERT_TRUE(large.ok());
  ASSERT_EQ(heap->GetStats().cache_hits, 1);
  for (int r = 0; r < 2; ++r) {
    char* buf = static_cast<char*>((*large)->peers[r]);
    char* sig = static_cast<char*>((*large)->signals[r]);
    EXPECT_GE(sig, buf + (1 << 20)) << "member " << r;
    EXPECT_LE(sig + 256, buf + (*large)->stride);
    EXPECT_EQ(sig, static_cast<char*>(signals[r]));  // and where they were
  }
}

// Free looks a pointer up before it reads through it: a pointer into memory
// that cannot be read, or one whose allocation is long gone, is refused
// without a fault.
TEST(SymmetricHeapTest, FreeRefusesStaleAndForeignPointersWithoutReadingThem) {
  HostBackend b({.device_count = 2});
  auto heap = SingleProcessHeap(b, 2);
  auto a = heap->Allocate(4096);  // live, so that a lookup has something to compare
  ASSERT_TRUE(a.ok());
  void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  EXPECT_EQ(heap->Free({static_cast<const SymmetricAllocation*>(page), 1}).code(),
            absl::StatusCode::kInvalidArgument);
  munmap(page, 4096);
  ASSERT_TRUE(heap->Free(*a).ok());
  ASSERT_TRUE(heap->EmptyCache().ok());  // the allocation's memory is gone now
  EXPECT_THAT(heap->Free(*a).message(), HasSubstr("not live here"));
  heap.reset();
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

// A cache hit hands the same allocation out again: the first owner's
// handle is stale, and freeing it must not release the second owner's
// allocation (which the next Allocate would then hand to a third while the
// second still writes into it).
TEST(SymmetricHeapTest, AStaleFreeAfterACacheHitIsRefusedAndChangesNothing) {
  HostBackend b({.device_count = 2});
  auto heap = SingleProcessHeap(b, 2);
  auto first = heap->Allocate(4096);
  ASSERT_TRUE(first.ok());
  const SymmetricHandle stale = *first;
  ASSERT_TRUE(heap->Free(stale).ok());
  auto second = heap->Allocate(4096);  // a hit: the same allocation, a new owner
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->allocation, stale.allocation);
  ASSERT_NE(second->generation, stale.generation);
  const absl::Status s = heap->Free(stale);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("stale handle"));
  // Nothing changed: the second owner's allocation is still live, so the
  // next Allocate builds another instead of handing it out.
  const SymmetricStats before = heap->GetStats();
  ASSERT_EQ(heap->Snapshot().size(), 1u);
  EXPECT_FALSE(heap->Snapshot()[0].cached);
  auto third = heap->Allocate(4096);
  ASSERT_TRUE(third.ok());
  EXPECT_NE(third->allocation, second->allocation);
  EXPECT_EQ(heap->GetStats().cache_hits, before.cache_hits);
  EXPECT_TRUE(heap->Free(*second).ok());
  EXPECT_TRUE(heap->Free(*third).ok());
  heap.reset();
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

// After EmptyCache a new allocation may be built at the address of a freed
// one; the old handle is still refused.
TEST(SymmetricHeapTest, AStaleFreeAfterEmptyCacheIsRefused) {
  HostBackend b({.device_count = 2});
  auto heap = SingleProcessHeap(b, 2);
  int reused = 0;
  for (int i = 0; i < 8; ++i) {
    auto old = heap->Allocate(4096);
    ASSERT_TRUE(old.ok());
    const SymmetricHandle stale = *old;
    ASSERT_TRUE(heap->Free(stale).ok());
    ASSERT_TRUE(heap->EmptyCache().ok());
    auto now = heap->Allocate(4096);
    ASSERT_TRUE(now.ok());
    reused += now->allocation == stale.allocation;
    EXPECT_EQ(heap->Free(stale).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(heap->Free(*now).ok());  // still this owner's to free
    ASSERT_TRUE(heap->EmptyCache().ok());
  }
  RecordProperty("address_reused", reused);
  heap.reset();
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

int Dumpable() { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0); }

// Hardening: with non_dumpable, the process is non-dumpable (no
// /proc/PID/mem or ptrace for other processes of this user) while a heap
// holds symmetric memory, cached included, and dumpable again once the
// last heap holds none; heaps without the option change nothing.
TEST(SymmetricHeapTest, NonDumpableWhileHoldingSymmetricMemory) {
  ASSERT_EQ(Dumpable(), 1);
  HostBackend b({.device_count = 2});
  auto plain = SingleProcessHeap(b, 2);
  auto a = plain->Allocate(4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(Dumpable(), 1);  // not asked for
  SymmetricOptions o;
  o.non_dumpable = true;
  auto first = SingleProcessHeap(b, 2, o);
  auto second = SingleProcessHeap(b, 2, o);
  EXPECT_FALSE(first->Allocate(0).ok());
  EXPECT_EQ(Dumpable(), 1);  // a failed Allocate changes nothing
  auto x = first->Allocate(4096);
  ASSERT_TRUE(x.ok());
  EXPECT_EQ(Dumpable(), 0);
  auto y = second->Allocate(4096);
  ASSERT_TRUE(y.ok());
  ASSERT_TRUE(first->Free(*x).ok());
  EXPECT_EQ(Dumpable(), 0);  // cached memory is still mapped
  ASSERT_TRUE(first->EmptyCache().ok());
  EXPECT_EQ(Dumpable(), 0);  // the second heap still holds some
  second.reset();
  EXPECT_EQ(Dumpable(), 1);
  auto z = first->Allocate(4096);  // and again
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(Dumpable(), 0);
  first.reset();
  EXPECT_EQ(Dumpable(), 1);
  ASSERT_TRUE(plain->Free(*a).ok());
}

TEST(SymmetricHeapTest, BadInputs) {
  HostBackend b({.device_count = 2});
  auto heap = SingleProcessHeap(b, 2);
  EXPECT_THAT(heap->Allocate(0).status().message(), HasSubstr("0 bytes"));
  auto a = heap->Allocate(4096);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(heap->Free(*a).ok());
  EXPECT_THAT(heap->Free(*a).message(), HasSubstr("double free"));
  EXPECT_FALSE(heap->Free(SymmetricHandle{}).ok());
  SymmetricGroup bad;
  bad.world_size = 2;
  bad.local_ranks = {0, 0};
  bad.local_devices = {0, 1};
  EXPECT_THAT(SymmetricHeap::Create(b, bad, MakeSingleProcessExchange()).status().message(),
              HasSubstr("out of range or repeated"));
  bad.local_ranks = {0, 1};
  bad.local_devices = {0, 9};
  EXPECT_FALSE(SymmetricHeap::Create(b, bad, MakeSingleProcessExchange()).ok());
  bad.local_ranks = {0};
  bad.local_devices = {0};  // member 1 is served by nobody
  auto lonely = SymmetricHeap::Create(b, bad, MakeSingleProcessExchange());
  ASSERT_TRUE(lonely.ok());
  EXPECT_THAT((*lonely)->Allocate(4096).status().message(), HasSubstr("no process contributed"));
  lonely->reset();
  heap.reset();
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

TEST(SymmetricHeapTest, FabricHandlesAreProbedAndFallBackToPosixFdsOnlyWhenAsked) {
  SymmetricOptions fabric;
  fabric.handle_type = HandleType::kFabric;
  SymmetricOptions fallback = fabric;
  fallback.fabric_fallback = true;
  SymmetricGroup g{2, {0, 1}, {0, 1}};
  // A device that says no, and one that says yes but cannot export (the
  // host backend's fabric_handles, like CUDA without an IMEX channel).
  for (bool claims : {false, true}) {
    HostBackend b({.device_count = 2, .fabric_handles = claims});
    const char* why = claims ? "exporting a fabric handle failed" : "no fabric handle support";
    auto refused = SymmetricHeap::Create(b, g, MakeSingleProcessExchange(), fabric);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(refused.status().message(), HasSubstr(why));
    EXPECT_THAT(refused.status().message(), HasSubstr("device 0"));
    EXPECT_EQ(b.LiveResources(), HostResourceCounts{}) << "the probe's memory was released";
    auto h = SymmetricHeap::Create(b, g, MakeSingleProcessExchange(), fallback);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ((*h)->handle_type(), HandleType::kPosixFd);
    EXPECT_THAT((*h)->handle_fallback_reason(), HasSubstr(why));
    auto a = (*h)->Allocate(1 << 20);
    ASSERT_TRUE(a.ok()) << a.status();
    static_cast<char*>((*a)->peers[1])[0] = 7;
    EXPECT_TRUE((*h)->Free(*a).ok());
    h->reset();
    EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
  }
  HostBackend b;
  auto fd = SymmetricHeap::Create(b, g, MakeSingleProcessExchange());
  ASSERT_TRUE(fd.ok());
  EXPECT_EQ((*fd)->handle_type(), HandleType::kPosixFd);
  EXPECT_EQ((*fd)->handle_fallback_reason(), "");
  // Only VmmCreate, VmmExport and VmmRelease probe: a POSIX FD heap makes no call.
  EXPECT_EQ(b.CallCount("VmmCreate"), 0);
}

TEST(SymmetricHeapTest, MulticastOnlyWhenAskedSupportedAndNotDisabled) {
  SymmetricOptions on;
  on.multicast = true;
  {
    HostBackend unsupported({.device_count = 2});
    auto heap = SingleProcessHeap(unsupported, 2, on);
    EXPECT_FALSE((*heap->Allocate(4096))->multicast);
    EXPECT_EQ(unsupported.CallCount("MulticastCreate"), 0);
  }
  {
    HostBackend supported({.device_count = 2, .multicast_supported = true});
    auto off = SingleProcessHeap(supported, 2);  // not asked
    EXPECT_FALSE((*off->Allocate(4096))->multicast);
    auto heap = SingleProcessHeap(supported, 2, on);
    auto a = heap->Allocate(4096);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_TRUE((*a)->multicast);
    EXPECT_EQ(supported.CallCount("MulticastAddDevice"), 2);
    EXPECT_EQ(supported.CallCount("MulticastBindMemory"), 2);
    for (const char* var : {"CMA_DISABLE_MULTICAST=1", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
                            "NCCL_NVLS_ENABLE=0"}) {
      std::string kv = var;
      const auto eq = kv.find('=');
      setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
      auto guarded = heap->Allocate(8 << 20);
      unsetenv(kv.substr(0, eq).c_str());
      ASSERT_TRUE(guarded.ok());
      EXPECT_FALSE((*guarded)->multicast) << var;
    }
    heap.reset();
    off.reset();
    EXPECT_EQ(supported.LiveResources().multicast_objects, 0);
  }
}

// ---------------------------------------------------------------- exchanges

TEST(ExchangeTest, SingleProcessDupsDescriptors) {
  auto x = MakeSingleProcessExchange();
  const int fd = memfd_create("x", MFD_CLOEXEC);
  auto all = x->AllGather({"hello", {fd}});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].bytes, "hello");
  ASSERT_EQ((*all)[0].fds.size(), 1u);
  EXPECT_NE((*all)[0].fds[0], fd);
  close((*all)[0].fds[0]);
  close(fd);
}

TEST(ExchangeTest, UnixSocketGathersBytesAndDescriptorsAcrossProcesses) {
  const std::string path = SocketPath("gather");
  auto codes = RunProcesses(3, [&](int r) {
    auto x = MakeUnixSocketExchange(path, r, 3, kTimeout, Token());
    if (!x.ok()) return false;
    const int fd = memfd_create("x", MFD_CLOEXEC);
    const std::string text = absl::StrFormat("from %d", r);
    if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) return false;
    for (int round = 0; round < 3; ++round) {
      auto all = (*x)->AllGather({absl::StrFormat("rank %d round %d", r, round), {fd}});
      if (!all.ok() || all->size() != 3) return false;
      for (int p = 0; p < 3; ++p) {
        if ((*all)[p].bytes != absl::StrFormat("rank %d round %d", p, round)) return false;
        char buf[16] = {};
        if ((*all)[p].fds.size() != 1 || pread((*all)[p].fds[0], buf, sizeof(buf), 0) <= 0) {
          return false;
        }
        if (std::string(buf) != absl::StrFormat("from %d", p)) return false;  // a real FD of p
        close((*all)[p].fds[0]);
      }
    }
    close(fd);
    return true;
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

TEST(ExchangeTest, MissingProcessTimesOutWithAClearError) {
  const auto t0 = absl::Now();
  auto x = MakeUnixSocketExchange(SocketPath("missing"), 0, 2, absl::Milliseconds(300), Token());
  EXPECT_EQ(x.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(x.status().message(), HasSubstr("timed out waiting for process 1 (of 2) to connect"));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  auto leaf = MakeUnixSocketExchange(SocketPath("nobody"), 1, 2, absl::Milliseconds(200), Token());
  EXPECT_THAT(leaf.status().message(), HasSubstr("process 0 never listened"));
}

TEST(ExchangeTest, CallbackBootstrapsASocketExchange) {
  int calls = 0;
  struct Ctx {
    int* calls;
  } ctx{&calls};
  AllGatherCallback cb = [](void* c, const void* send, size_t len, void* recv) {
    ++*static_cast<Ctx*>(c)->calls;
    std::memcpy(recv, send, len);  // a world of one
    return 0;
  };
  auto x = MakeCallbackExchange(cb, &ctx, 0, 1, kTimeout);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(calls, 1);
  auto all = (*x)->AllGather({"solo", {}});
  ASSERT_TRUE(all.ok());
  EXPECT_EQ((*all)[0].bytes, "solo");
  AllGatherCallback failing = [](void*, const void*, size_t, void*) { return 1; };
  EXPECT_THAT(MakeCallbackExchange(failing, nullptr, 0, 1, kTimeout).status().message(),
              HasSubstr("all-gather failed"));
}

// ---------------------------------------------------------------- processes

class SymmetricProcessTest : public ::testing::TestWithParam<int> {};

TEST_P(SymmetricProcessTest, PeerWritesAreVisibleToEveryMember) {
  const int world = GetParam();
  const std::string path = SocketPath("peers");
  auto codes = RunProcesses(world, [&](int r) {
    HostBackend b({.device_count = 1});
    auto heap = ProcessHeap(b, path, r, world);
    if (!heap) return false;
    auto a = heap->Allocate(1 << 20);
    if (!a.ok()) return false;
    // Write into every peer's buffer: slot r of member p gets p * 100 + r.
    for (int p = 0; p < world; ++p) static_cast<std::int32_t*>((*a)->peers[p])[r] = p * 100 + r;
    if (!heap->EmptyCache().ok()) return false;  // a collective: everyone has written
    for (int p = 0; p < world; ++p) {  // my buffer, as every peer wrote it
      if (static_cast<std::int32_t*>((*a)->peers[r])[p] != r * 100 + p) return false;
    }
    const void* base = (*a)->base;
    if (!heap->Free(*a).ok()) return false;
    const auto hits = heap->GetStats().cache_hits;
    auto again = heap->Allocate(1 << 20);  // collective reuse of the same segments
    if (!again.ok() || (*again)->base != base || heap->GetStats().cache_hits != hits + 1) {
      return false;
    }
    if (!heap->Free(*again).ok() || !heap->EmptyCache().ok()) return false;
    heap.reset();
    return b.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

TEST_P(SymmetricProcessTest, MakeSymmetricRoundsUpToTheLargest) {
  const int world = GetParam();
  const std::string path = SocketPath("makesym");
  auto codes = RunProcesses(world, [&](int r) {
    HostBackend b({.device_count = 1});
    auto heap = ProcessHeap(b, path, r, world);
    if (!heap) return false;
    auto a = heap->Allocate((r + 1) << 20, /*make_symmetric=*/true);
    if (!a.ok() || (*a)->bytes != static_cast<std::size_t>(world) << 20) return false;
    std::memset((*a)->peers[(r + 1) % world], 7, (*a)->bytes);  // the largest fits everywhere
    return heap->Free(*a).ok();
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

INSTANTIATE_TEST_SUITE_P(Processes, SymmetricProcessTest, ::testing::Values(2, 3, 4));

TEST(SymmetricProcessTest, AMemberThatFellBackFromFabricSharesWithOneThatAskedForFds) {
  // Rank 0 asks for fabric handles on a device that cannot export them and
  // falls back; rank 1 asks for POSIX FDs: each announces what it sends.
  const std::string path = SocketPath("fallback");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend b({.device_count = 1, .fabric_handles = r == 0});
    auto x = MakeUnixSocketExchange(path, r, 2, kTimeout, Token());
    if (!x.ok()) return false;
    SymmetricOptions o;
    if (r == 0) {
      o.handle_type = HandleType::kFabric;
      o.fabric_fallback = true;
    }
    auto heap = SymmetricHeap::Create(b, SymmetricGroup{2, {r}, {0}}, std::move(*x), o);
    if (!heap.ok() || (*heap)->handle_type() != HandleType::kPosixFd) return false;
    auto a = (*heap)->Allocate(1 << 20);
    if (!a.ok()) return false;
    static_cast<std::int32_t*>((*a)->peers[1 - r])[r] = 40 + r;
    if (!(*heap)->EmptyCache().ok()) return false;  // a collective: both have written
    if (static_cast<std::int32_t*>((*a)->peers[r])[1 - r] != 40 + (1 - r)) return false;
    return (*heap)->Free(*a).ok();
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

TEST(SymmetricProcessErrors, MismatchedSizesWithoutMakeSymmetric) {
  const std::string path = SocketPath("mismatch");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend b({.device_count = 1});
    auto heap = ProcessHeap(b, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(r == 0 ? 4096 : 8192);
    const bool clear = a.status().code() == absl::StatusCode::kInvalidArgument &&
                       absl::StrContains(a.status().message(), "different sizes");
    heap.reset();
    return clear && b.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// On a cache hit too, members that ask for different sizes all get the
// error (a hit once skipped the comparison: each took the cached segment
// with its own idea of the size).
TEST(SymmetricProcessErrors, MismatchedSizesOnACacheHitFailEveryMember) {
  const std::string path = SocketPath("hitmismatch");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend b({.device_count = 1});
    auto heap = ProcessHeap(b, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(1000);
    if (!a.ok() || !heap->Free(*a).ok()) return false;
    auto hit = heap->Allocate(r == 0 ? 1000 : 5000);  // one stride: both would hit
    return hit.status().code() == absl::StatusCode::kInvalidArgument &&
           absl::StrContains(hit.status().message(), "different sizes");
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Frees that come in another order on each member still leave every member
// reusing the same allocation: the cache is keyed by the collective id, not
// by the order of the frees. Each member writes into its peer's buffer and
// must find its peer's write in its own.
TEST(SymmetricProcessErrors, FreesInAnotherOrderStillShareOneAllocation) {
  const std::string path = SocketPath("freeorder");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend b({.device_count = 1});
    auto heap = ProcessHeap(b, path, r, 2);
    if (!heap) return false;
    auto x = heap->Allocate(1 << 20);
    auto y = heap->Allocate(1 << 20);
    if (!x.ok() || !y.ok()) return false;
    const std::uint64_t first = (*x)->id;
    if (r == 0 ? !heap->Free(*x).ok() || !heap->Free(*y).ok()
               : !heap->Free(*y).ok() || !heap->Free(*x).ok()) {
      return false;
    }
    auto z = heap->Allocate(1 << 20);
    if (!z.ok() || (*z)->id != first) return false;
    static_cast<std::int32_t*>((*z)->peers[1 - r])[r] = 1000 + r;
    if (!heap->EmptyCache().ok()) return false;  // a collective: both have written
    return static_cast<std::int32_t*>((*z)->peers[r])[1 - r] == 1000 + (1 - r);
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// A stale free is refused on every member, and the group stays in step: the
// next Allocate is a miss on both (no member hands out an owned buffer).
TEST(SymmetricProcessErrors, AStaleFreeIsRefusedOnEveryMember) {
  const std::string path = SocketPath("stalefree");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend b({.device_count = 1});
    auto heap = ProcessHeap(b, path, r, 2);
    if (!heap) return false;
    auto first = heap->Allocate(1 << 20);
    if (!first.ok() || !heap->Free(*first).ok()) return false;
    auto second = heap->Allocate(1 << 20);  // a hit on both
    if (!second.ok() || second->allocation != first->allocation) return false;
    if (heap->Free(*first).code() != absl::StatusCode::kInvalidArgument) return false;
    auto third = heap->Allocate(1 << 20);
    if (!third.ok() || (*third)->id == (*second)->id) return false;
    // Each member's writes land in its peer's copy of the right allocation.
    static_cast<std::int32_t*>((*second)->peers[1 - r])[r] = 10 + r;
    static_cast<std::int32_t*>((*third)->peers[1 - r])[r] = 20 + r;
    if (!heap->EmptyCache().ok()) return false;
    return static_cast<std::int32_t*>((*second)->peers[r])[1 - r] == 10 + (1 - r) &&
           static_cast<std::int32_t*>((*third)->peers[r])[1 - r] == 20 + (1 - r) &&
           heap->Free(*second).ok() && heap->Free(*third).ok();
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

TEST(SymmetricProcessErrors, AMemberDyingMidRendezvousFailsTheOthers) {
  const std::string path = SocketPath("death");
  const auto t0 = absl::Now();
  auto codes = RunProcesses(3, [&](int r) {
    HostBackend b({.device_count = 1});
    auto heap = ProcessHeap(b, path, r, 3, absl::Seconds(3));
    // Process 0 may see it leave while others are still connecting: then its
    // rendezvous fails, naming it, and so does the others' first Allocate.
    if (!heap) return r == 0;
    if (r == 2) _exit(42);  // dies after connecting, before the collective
    auto a = heap->Allocate(1 << 20);
    const bool failed = !a.ok();
    heap.reset();
    // A clear error, and nothing left behind.
    return failed && b.LiveResources() == HostResourceCounts{};
  });
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0);
  EXPECT_EQ(codes[2], 42);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(10));  // never a hang
}

}  // namespace
}  // namespace cma
