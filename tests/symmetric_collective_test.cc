// The symmetric heap's members fail together and never drift apart: a member
// whose part of a collective fails tells the others at once; calls out of
// step are named; descriptors a round does not expect are closed; a member
// whose exchange breaks shuts its sockets so the others learn at once; and a
// broken group fails fast, naming why. Real processes (fork) on real Unix
// sockets, on the host backend (with injected faults).
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <thread>
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

int OpenFds() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

// Member 1's VmmCreate fails: it still joins the round with its reason, so
// member 0 fails at once naming it (not after its timeout), nothing leaks,
// and the group stays usable.
TEST(SymmetricCollectiveTest, AMemberWhoseDriverCallFailsFailsEveryMemberAtOnce) {
  const std::string path = SocketPath("create-fails");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    FaultInjectingBackend faulty(host);
    if (r == 1) faulty.SetPlan({.kind = FaultKind::kAllocation, .fail_nth = 1});
    auto heap = ProcessHeap(faulty, path, r, 2);
    if (!heap) return false;
    const absl::Time t0 = absl::Now();
    auto a = heap->Allocate(1 << 20);
    const bool fast = absl::Now() - t0 < absl::Seconds(2);  // the timeout is 5 s
    const bool named = r == 1 || (a.status().code() == absl::StatusCode::kAborted &&
                                  absl::StrContains(a.status().message(), "process 1 failed"));
    if (a.ok() || !fast || !named) return false;
    if (host.LiveResources().mappings != 0) return false;
    auto again = heap->Allocate(1 << 20);  // together again: both build it
    if (!again.ok() || !heap->Free(*again).ok()) return false;
    heap.reset();
    return host.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// A request this member refuses before any driver call (0 bytes) still
// joins the round: the others fail at once, naming it, and the group goes on.
TEST(SymmetricCollectiveTest, ARequestOneMemberRefusesFailsEveryMemberAtOnce) {
  const std::string path = SocketPath("zero");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    auto heap = ProcessHeap(host, path, r, 2);
    if (!heap) return false;
    const absl::Time t0 = absl::Now();
    auto a = heap->Allocate(r == 0 ? 0 : 4096);
    if (a.ok() || absl::Now() - t0 > absl::Seconds(2)) return false;
    if (!absl::StrContains(a.status().message(), "0 bytes")) return false;
    auto again = heap->Allocate(4096);
    return again.ok() && heap->Free(*again).ok();
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Member 0's import of member 1's handle fails after the handles were
// exchanged: the commit round makes member 1 undo its allocation too, so no
// member keeps an allocation another lacks.
TEST(SymmetricCollectiveTest, AFailedImportUndoesTheAllocationOnEveryMember) {
  const std::string path = SocketPath("import-fails");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    FaultInjectingBackend faulty(host);
    // Member 0's kExport calls: its own VmmExport, then VmmImport of member 1's.
    if (r == 0) faulty.SetPlan({.kind = FaultKind::kExport, .fail_nth = 2});
    auto heap = ProcessHeap(faulty, path, r, 2);
    if (!heap) return false;
    auto a = heap->Allocate(1 << 20);
    if (a.ok() || host.LiveResources().mappings != 0) return false;
    if (r == 1 && !absl::StrContains(a.status().message(), "process 0 failed")) return false;
    heap.reset();
    return host.LiveResources() == HostResourceCounts{};
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// Member 0 allocates while member 1 empties its cache: both are told the
// calls are out of step, naming both, and every later collective fails at
// once with the same reason (it once read the other's round as its own).
TEST(SymmetricCollectiveTest, CallsOutOfStepAreNamedAndTheGroupFailsFastAfter) {
  const std::string path = SocketPath("out-of-step");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    auto heap = ProcessHeap(host, path, r, 2);
    if (!heap) return false;
    absl::Status s = r == 0 ? heap->Allocate(4096).status() : heap->EmptyCache();
    if (s.code() != absl::StatusCode::kFailedPrecondition ||
        !absl::StrContains(s.message(), "out of step") ||
        !absl::StrContains(s.message(), "EmptyCache") ||
        !absl::StrContains(s.message(), "Allocate")) {
      return false;
    }
    const absl::Time t0 = absl::Now();
    absl::Status later = heap->EmptyCache();
    return later.code() == absl::StatusCode::kFailedPrecondition &&
           absl::StrContains(later.message(), "out of step") &&
           absl::Now() - t0 < absl::Milliseconds(100);
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// An exchange whose "peer" sends a descriptor in a round that carries none
// (the sizes), then fails: every descriptor it handed over is closed.
class LeakyPeerExchange final : public Exchange {
 public:
  int process_count() const override { return 2; }
  int process_index() const override { return 0; }
  absl::StatusOr<std::vector<Contribution>> AllGather(const Contribution& mine) override {
    if (++rounds_ > 1) return absl::UnavailableError("the peer went away");
    const int fd = memfd_create("stray", MFD_CLOEXEC);
    return std::vector<Contribution>{{mine.bytes, {}}, {mine.bytes, {fd}}};
  }

 private:
  int rounds_ = 0;
};

TEST(SymmetricCollectiveTest, DescriptorsInARoundThatCarriesNoneAreClosed) {
  const int before = OpenFds();
  {
    HostBackend host({.device_count = 1});
    SymmetricGroup g{2, {0}, {0}};
    auto heap = SymmetricHeap::Create(host, g, std::make_unique<LeakyPeerExchange>());
    ASSERT_TRUE(heap.ok()) << heap.status();
    EXPECT_FALSE((*heap)->Allocate(4096).ok());
  }
  EXPECT_EQ(OpenFds(), before);
}

// A peer that mirrors every round but announces its handles as `type`
// (after the round's 14-byte tag and the member count): 1 is a fabric
// handle, which the host backend cannot import; 2 is no type at all.
class AnnouncingPeerExchange final : public Exchange {
 public:
  explicit AnnouncingPeerExchange(std::uint32_t type) : type_(type) {}
  int process_count() const override { return 2; }
  int process_index() const override { return 0; }
  absl::StatusOr<std::vector<Contribution>> AllGather(const Contribution& mine) override {
    constexpr std::size_t kTag = 14;             // magic, op, ok, sequence
    constexpr std::uint8_t kHandlesRound = 3;    // SymmetricHeap::Op::kHandles
    Contribution peer{mine.bytes, {}};
    const bool handles =
        peer.bytes.size() >= kTag + 12 && static_cast<std::uint8_t>(peer.bytes[4]) == kHandlesRound;
    if (handles) {
      const std::int32_t member = 1;
      std::memcpy(&peer.bytes[kTag + 4], &type_, sizeof(type_));
      std::memcpy(&peer.bytes[kTag + 8], &member, sizeof(member));
    }
    std::vector<Contribution> all(2);
    all[0].bytes = mine.bytes;
    for (int fd : mine.fds) all[0].fds.push_back(dup(fd));  // as a real exchange returns them
    all[1] = std::move(peer);
    return all;
  }

 private:
  std::uint32_t type_;
};

TEST(SymmetricCollectiveTest, HandlesAreImportedAsTheirSenderAnnouncesThem) {
  const int before = OpenFds();
  for (auto [type, why] : {std::pair<std::uint32_t, const char*>{1, "imports POSIX FDs only"},
                           {2, "malformed handles from process 1"}}) {
    HostBackend host({.device_count = 1});
    {
      auto heap = SymmetricHeap::Create(host, SymmetricGroup{2, {0}, {0}},
                                        std::make_unique<AnnouncingPeerExchange>(type));
      ASSERT_TRUE(heap.ok()) << heap.status();
      absl::Status s = (*heap)->Allocate(4096).status();
      EXPECT_THAT(s.message(), ::testing::HasSubstr(why)) << type;
    }
    EXPECT_EQ(host.LiveResources(), HostResourceCounts{}) << type;
  }
  EXPECT_EQ(OpenFds(), before);
}

// Member 1's exchange breaks on its side (too many descriptors to send):
// it shuts its socket, so process 0 learns at once instead of waiting out
// its timeout, and member 1's later rounds fail at once, naming the first
// failure.
TEST(SymmetricCollectiveTest, AMemberWhoseExchangeBreaksShutsItSoTheOthersLearnAtOnce) {
  const std::string path = SocketPath("shut");
  auto codes = RunProcesses(2, [&](int r) {
    auto x = MakeUnixSocketExchange(path, r, 2, absl::Seconds(5), Token());
    if (!x.ok()) return false;
    const absl::Time t0 = absl::Now();
    if (r == 0) {
      auto all = (*x)->AllGather({"zero", {}});
      return !all.ok() && all.status().code() == absl::StatusCode::kUnavailable &&
             absl::Now() - t0 < absl::Seconds(2);
    }
    const int fd = memfd_create("many", MFD_CLOEXEC);
    std::vector<int> many(251, fd);
    auto all = (*x)->AllGather({"one", many});
    auto later = (*x)->AllGather({"one", {}});
    close(fd);
    return !all.ok() && later.status().code() == absl::StatusCode::kFailedPrecondition &&
           absl::StrContains(later.status().message(), "too many FDs");
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}


// Statistics never wait on a collective: while one thread's Allocate waits
// for a member that stalls 2 s, another thread's GetStats and Snapshot
// return at once, with the state as of before that Allocate (issue 19,
// item 13: cma_stats_json waited behind the heap's lock).
TEST(SymmetricCollectiveTest, StatisticsDoNotWaitForAStalledCollective) {
  const std::string path = SocketPath("stats-stall");
  auto codes = RunProcesses(2, [&](int r) {
    HostBackend host({.device_count = 1});
    auto heap = ProcessHeap(host, path, r, 2);
    if (!heap) return false;
    auto first = heap->Allocate(4096);
    if (!first.ok()) return false;
    if (r == 1) {
      absl::SleepFor(absl::Seconds(2));  // the stall
      return heap->Allocate(1 << 20).ok();
    }
    absl::StatusOr<SymmetricHandle> second = absl::UnknownError("not run");
    std::thread collective([&] { second = heap->Allocate(1 << 20); });
    absl::SleepFor(absl::Milliseconds(200));  // it is waiting for member 1 by now
    const absl::Time t0 = absl::Now();
    const SymmetricStats stats = heap->GetStats();
    const std::vector<SymmetricSnapshot> snap = heap->Snapshot();
    const absl::Duration took = absl::Now() - t0;
    collective.join();
    if (took > absl::Milliseconds(300)) {
      std::fprintf(stderr, "statistics took %s\n", absl::FormatDuration(took).c_str());
      return false;
    }
    // The state between the two Allocates: one allocation, one live entry.
    if (stats.allocations != 1 || snap.size() != 1 || snap[0].bytes != 4096 || snap[0].cached) {
      return false;
    }
    return second.ok() && heap->GetStats().allocations == 2 && heap->Snapshot().size() == 2;
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

}  // namespace
}  // namespace cma
