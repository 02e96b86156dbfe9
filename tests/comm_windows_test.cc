// Communicator windows on symmetric allocations (SymmetricHeap::
// RegisterWindow, ReleaseWindows): registered together or not at all,
// cached with their allocation, released before its memory is, and bad
// input refused on every member with nothing changed. Members are forked
// processes on real Unix sockets, each with its own host backend and an
// emulated communicator (the host backend checks what NCCL's registration
// checks, and refuses to unmap memory a window still covers).
#include <string>
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

std::unique_ptr<SymmetricHeap> OneMemberHeap(Backend& b) {
  SymmetricGroup g;
  g.world_size = 1;
  g.local_ranks = {0};
  g.local_devices = {0};
  auto h = SymmetricHeap::Create(b, g, MakeSingleProcessExchange());
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : nullptr;
}

// Registered once, then cached with the allocation: a second registration,
// or one after the allocation went through the cache, calls nothing; the
// window goes before the memory does (EmptyCache), and nothing leaks.
TEST(CommWindowsTest, CachedWithItsAllocationAndReleasedBeforeItsMemory) {
  HostBackend b({.device_count = 1});
  const CommHandle comm = b.MakeEmulatedComm(0, 1, 0);
  auto heap = OneMemberHeap(b);
  auto a = heap->Allocate(3 << 20);
  ASSERT_TRUE(a.ok()) << a.status();
  auto w = heap->RegisterWindow(*a, comm);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NE(*w, 0u);
  EXPECT_EQ(b.LiveResources().comm_windows, 1);
  EXPECT_EQ(heap->GetStats().windows, 1);
  EXPECT_EQ(*heap->RegisterWindow(*a, comm), *w);
  ASSERT_TRUE(heap->Free(*a).ok());
  auto again = heap->Allocate(3 << 20);  // a cache hit: the same allocation
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->allocation->id, a->allocation->id);
  EXPECT_EQ(*heap->RegisterWindow(*again, comm), *w);
  EXPECT_EQ(b.CallCount("RegisterCommWindow"), 1);
  ASSERT_TRUE(heap->Free(*again).ok());
  ASSERT_TRUE(heap->EmptyCache().ok());  // would fail to unmap under a window
  EXPECT_EQ(heap->GetStats().windows, 0);
  EXPECT_EQ(b.CallCount("DeregisterCommWindow"), 1);
  HostResourceCounts none;
  EXPECT_EQ(b.LiveResources(), none);
}

TEST(CommWindowsTest, TheHeapsDestructionDeregistersFirst) {
  HostBackend b({.device_count = 1});
  const CommHandle comm = b.MakeEmulatedComm(0, 1, 0);
  {
    auto heap = OneMemberHeap(b);
    auto a = heap->Allocate(1 << 20);
    auto c = heap->Allocate(5 << 20);
    ASSERT_TRUE(heap->RegisterWindow(*a, comm).ok());
    ASSERT_TRUE(heap->RegisterWindow(*c, comm).ok());
    ASSERT_TRUE(heap->Free(*c).ok());  // cached, window and all
    EXPECT_EQ(b.LiveResources().comm_windows, 2);
  }
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

// ReleaseWindows lets go of a communicator's windows (live and cached), and
// of no other's; a later registration makes a new one.
TEST(CommWindowsTest, ReleaseWindowsTakesOneCommunicatorsWindows) {
  HostBackend b({.device_count = 1});
  const CommHandle comm = b.MakeEmulatedComm(0, 1, 0);
  const CommHandle other = b.MakeEmulatedComm(0, 1, 0);
  auto heap = OneMemberHeap(b);
  auto a = heap->Allocate(1 << 20);
  auto c = heap->Allocate(1 << 20);
  ASSERT_TRUE(heap->RegisterWindow(*a, comm).ok());
  ASSERT_TRUE(heap->RegisterWindow(*c, comm).ok());
  ASSERT_TRUE(heap->RegisterWindow(*a, other).ok());
  ASSERT_TRUE(heap->Free(*c).ok());
  auto released = heap->ReleaseWindows(comm);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_EQ(*released, 2);
  EXPECT_EQ(b.LiveResources().comm_windows, 1);
  EXPECT_EQ(heap->GetStats().windows, 1);
  b.DestroyEmulatedComm(comm);  // now safe: nothing of cma's refers to it
  auto w = heap->RegisterWindow(*a, other);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(b.CallCount("RegisterCommWindow"), 3);  // `other`'s window was cached
  EXPECT_FALSE(heap->ReleaseWindows(0).ok());
}

// Bad input is refused with a clear error, and nothing changes.
TEST(CommWindowsTest, BadInputIsRefusedAndChangesNothing) {
  HostBackend b({.device_count = 2});
  auto heap = OneMemberHeap(b);
  auto a = heap->Allocate(1 << 20);
  ASSERT_TRUE(a.ok());
  struct Case {
    const char* what;
    CommHandle comm;
    SymmetricHandle handle;
    absl::StatusCode code;
    const char* says;
  };
  SymmetricHandle stale = *a;
  stale.generation += 7;
  const std::vector<Case> cases = {
      {"null communicator", 0, *a, absl::StatusCode::kInvalidArgument, "null communicator"},
      {"not a communicator", 0xdead, *a, absl::StatusCode::kInvalidArgument,
       "not a live communicator"},
      {"another rank's", b.MakeEmulatedComm(1, 2, 0), *a, absl::StatusCode::kInvalidArgument,
       "rank 1 of 2 on device 0, but this member is rank 0 of 1 on device 0"},
      {"another device's", b.MakeEmulatedComm(0, 1, 1), *a, absl::StatusCode::kInvalidArgument,
       "on device 1"},
      {"stale handle", b.MakeEmulatedComm(0, 1, 0), stale, absl::StatusCode::kInvalidArgument,
       "stale handle"},
      {"null handle", b.MakeEmulatedComm(0, 1, 0), SymmetricHandle{},
       absl::StatusCode::kInvalidArgument, "not live here"},
      {"windows unsupported", b.MakeEmulatedComm(0, 1, 0, /*windows_supported=*/false), *a,
       absl::StatusCode::kUnimplemented, "registered no window"},
  };
  for (const Case& c : cases) {
    auto w = heap->RegisterWindow(c.handle, c.comm);
    EXPECT_EQ(w.status().code(), c.code) << c.what << ": " << w.status();
    EXPECT_THAT(w.status().message(), HasSubstr(c.says)) << c.what;
    EXPECT_EQ(b.LiveResources().comm_windows, 0) << c.what;
    EXPECT_EQ(heap->GetStats().windows, 0) << c.what;
  }
  // The heap goes on: a good registration works, the allocation frees.
  EXPECT_TRUE(heap->RegisterWindow(*a, b.MakeEmulatedComm(0, 1, 0)).ok());
  EXPECT_TRUE(heap->Free(*a).ok());
}

TEST(CommWindowsTest, SeveralMembersInOneProcessAreRefused) {
  HostBackend b({.device_count = 2});
  SymmetricGroup g{2, {0, 1}, {0, 1}};
  auto heap = SymmetricHeap::Create(b, g, MakeSingleProcessExchange());
  ASSERT_TRUE(heap.ok());
  auto a = (*heap)->Allocate(1 << 20);
  auto w = (*heap)->RegisterWindow(*a, b.MakeEmulatedComm(0, 2, 0));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(w.status().message(), HasSubstr("one member per process"));
}

// ------------------------------------------------------------ processes

// Two members register together; each window is its own buffer's, of the
// stride; cached registrations make no library call; both release together.
TEST(CommWindowsTest, MembersRegisterTogether) {
  const std::string path = SocketPath("windows-together");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    const CommHandle comm = host.MakeEmulatedComm(r, 2, 0);
    auto heap = ProcessHeap(host, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(2 << 20);
    if (!a.ok()) return false;
    auto w = heap->RegisterWindow(*a, comm);
    auto w2 = heap->RegisterWindow(*a, comm);
    if (!w.ok() || !w2.ok() || *w != *w2 || host.CallCount("RegisterCommWindow") != 1) {
      return false;
    }
    auto released = heap->ReleaseWindows(comm);
    if (!released.ok() || *released != 1 || host.LiveResources().comm_windows != 0) return false;
    if (!heap->Free(*a).ok() || !heap->EmptyCache().ok()) return false;
    heap.reset();
    return host.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Member 1 passes a communicator that is not its own: it joins the round
// with the reason, so member 0 fails at once naming it, and neither calls
// the library (no one is left waiting inside NCCL's collective).
TEST(CommWindowsTest, OneMembersBadCommunicatorFailsEveryMemberBeforeTheLibrary) {
  const std::string path = SocketPath("windows-bad-comm");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    const CommHandle comm = host.MakeEmulatedComm(r == 1 ? 0 : r, 2, 0);
    auto heap = ProcessHeap(host, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(1 << 20);
    if (!a.ok()) return false;
    const absl::Time t0 = absl::Now();
    auto w = heap->RegisterWindow(*a, comm);
    const bool fast = absl::Now() - t0 < absl::Seconds(2);
    const bool named =
        r == 1 ? absl::StrContains(w.status().message(), "this member is rank 1")
               : w.status().code() == absl::StatusCode::kAborted &&
                     absl::StrContains(w.status().message(), "process 1 failed");
    if (w.ok() || !fast || !named || host.CallCount("RegisterCommWindow") != 0) return false;
    // Together again with the right communicator.
    const CommHandle good = host.MakeEmulatedComm(r, 2, 0);
    return heap->RegisterWindow(*a, good).ok() && host.LiveResources().comm_windows == 1;
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Member 0's registration fails inside the library: member 1, whose own
// succeeded, deregisters it, so no member keeps a window another lacks.
TEST(CommWindowsTest, AFailedRegistrationIsUndoneOnEveryMember) {
  const std::string path = SocketPath("windows-undo");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    FaultInjectingBackend faulty(host);
    if (r == 0) faulty.SetPlan({.kind = FaultKind::kCommWindow, .fail_nth = 1});
    const CommHandle comm = host.MakeEmulatedComm(r, 2, 0);
    auto heap = ProcessHeap(faulty, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(1 << 20);
    if (!a.ok()) return false;
    auto w = heap->RegisterWindow(*a, comm);
    const bool named = r == 0 ? absl::StrContains(w.status().message(), "injected fault")
                              : absl::StrContains(w.status().message(), "process 0 failed");
    if (w.ok() || !named || host.LiveResources().comm_windows != 0) return false;
    if (r == 1 && host.CallCount("DeregisterCommWindow") != 1) return false;
    if (heap->GetStats().windows != 0) return false;
    auto again = heap->RegisterWindow(*a, comm);  // the fault was once
    return again.ok() && host.LiveResources().comm_windows == 1;
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Members naming different allocations are refused on both, before the
// library is called.
TEST(CommWindowsTest, MembersNamingDifferentAllocationsAreRefused) {
  const std::string path = SocketPath("windows-different");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    const CommHandle comm = host.MakeEmulatedComm(r, 2, 0);
    auto heap = ProcessHeap(host, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(1 << 20);
    auto c = heap->Allocate(1 << 20);
    if (!a.ok() || !c.ok()) return false;
    auto w = heap->RegisterWindow(r == 0 ? *a : *c, comm);
    return w.status().code() == absl::StatusCode::kInvalidArgument &&
           absl::StrContains(w.status().message(), "different allocations") &&
           host.CallCount("RegisterCommWindow") == 0;
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Members that release windows on communicators that are not each other's
// counterparts (each process names its own) would drift apart: refused on
// every member, nothing released. (Review.)
TEST(CommWindowsTest, ReleasingDifferentCommunicatorsIsRefusedAndReleasesNothing) {
  const std::string path = SocketPath("windows-release-diverge");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    const CommHandle x = host.MakeEmulatedComm(r, 2, 0);
    const CommHandle y = host.MakeEmulatedComm(r, 2, 0);
    auto heap = ProcessHeap(host, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(1 << 20);
    auto b = heap->Allocate(1 << 20);
    if (!a.ok() || !b.ok() || !heap->RegisterWindow(*a, x).ok() ||
        !heap->RegisterWindow(*b, y).ok() || !heap->RegisterWindow(*a, y).ok()) {
      return false;
    }
    // Rank 0 releases x (a's window), rank 1 y (a's and b's): different sets.
    auto released = heap->ReleaseWindows(r == 0 ? x : y);
    if (released.ok() || !absl::StrContains(released.status().message(), "nothing is released")) {
      return false;
    }
    return host.LiveResources().comm_windows == 3 && heap->GetStats().windows == 3;
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// A destroyed communicator's cached window is not handed out again. (Review.)
TEST(CommWindowsTest, ACachedWindowOfADestroyedCommunicatorIsRefused) {
  HostBackend b({.device_count = 1});
  const CommHandle comm = b.MakeEmulatedComm(0, 1, 0);
  auto heap = OneMemberHeap(b);
  auto a = heap->Allocate(1 << 20);
  ASSERT_TRUE(heap->RegisterWindow(*a, comm).ok());
  ASSERT_TRUE(heap->ReleaseWindows(comm).ok());
  b.DestroyEmulatedComm(comm);
  auto w = heap->RegisterWindow(*a, comm);
  EXPECT_THAT(w.status().message(), HasSubstr("not a live communicator"));
  const CommHandle other = b.MakeEmulatedComm(0, 1, 0);
  ASSERT_TRUE(heap->RegisterWindow(*a, other).ok());
  b.DestroyEmulatedComm(other);  // without a release first: its window is not served again
  EXPECT_FALSE(heap->RegisterWindow(*a, other).ok());
}

}  // namespace
}  // namespace cma
