// Randomized collectives across real processes, with fixed seeds so that a
// failure replays: every member runs the same random sequence of Allocate
// (sizes that hit and miss the cache, make_symmetric), Free (pairs freed in
// a different order on every member) and EmptyCache, while each member's
// backend fails a random few of its driver calls. The members must agree on
// every outcome (all succeed with the same allocation, or all fail), see each
// other's writes in every allocation, and leave nothing behind. Both
// providers: VMM, and NVSHMEM (the host backend's emulation, whose
// collectives fail if cma ever enters one that another member does not),
// with every peer mapped or none (writes then go through Put).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/symmetric_process_util.h"

namespace cma {
namespace {

struct Params {
  int world;
  std::uint64_t seed;
  SymmetricProvider provider = SymmetricProvider::kVmm;
  bool unreachable = false;  // NVSHMEM: no peer mapped; writes go through Put
};

constexpr int kOps = 80;

// One member's run; its outcome of every op goes to `log` (one line each),
// for the parent to compare across members. False on a broken invariant
// that this member can see alone.
bool RunMember(const Params& p, int rank, const std::string& path, const std::string& log) {
  HostBackend host({.device_count = 1, .shmem_unreachable = p.unreachable});
  FaultInjectingBackend faulty(host);
  // The members' faults differ (their own seeds); the sequence is shared.
  // NVSHMEM's local steps are fewer (no VMM calls): every member's tables fail.
  const bool shmem = p.provider == SymmetricProvider::kNvshmem;
  faulty.SetPlan({.kind = rank % 2 || shmem ? FaultKind::kAllocation : FaultKind::kVmmMap,
                  .probability = shmem ? 0.06 : 0.03,
                  .seed = p.seed * 101 + rank});
  auto heap = ProcessHeap(faulty, path, rank, p.world, kTimeout, WithProvider(p.provider));
  if (!heap) return false;
  std::mt19937_64 shared(p.seed);                // the same on every member
  std::mt19937_64 mine(p.seed * 7919 + rank);    // this member's own choices
  std::ofstream out(log);
  std::vector<SymmetricHandle> live;  // in collective-id order on every member
  const SymmetricAllocation* unchecked = nullptr;  // written, not yet read back (its allocation)
  std::int32_t unchecked_token = 0;
  const int world = p.world;
  // Reads back what the previous member wrote into ours, once a collective
  // round has passed since (every member wrote before it entered the round).
  auto check = [&]() -> bool {
    if (unchecked == nullptr) return true;
    const auto* slots = static_cast<const std::int32_t*>(unchecked->peers[rank]);
    const bool ok = slots[(rank + world - 1) % world] == unchecked_token;
    unchecked = nullptr;
    return ok;
  };
  for (int op = 0; op < kOps; ++op) {
    const int kind = static_cast<int>(shared() % 10);
    if (kind < 6) {  // Allocate: few sizes, so that the cache hits
      static constexpr std::size_t kSizes[] = {4096, 100000, 1 << 20, 3 << 20};
      const bool sym = shared() % 4 == 0;
      const std::size_t want = kSizes[shared() % 4];
      const std::size_t bytes = sym ? want / (1 + rank) : want;  // make_symmetric: uneven
      auto a = heap->Allocate(bytes, sym);
      if (!check()) return false;
      if (!a.ok()) {
        out << op << " allocate failed\n";
        continue;
      }
      out << op << " allocate id " << (*a)->id << " bytes " << (*a)->bytes << "\n";
      if ((*a)->bytes < bytes) return false;
      // The whole of our request past the members' slots (which the others
      // write now), and our slot in the next member's buffer.
      std::memset(static_cast<char*>((*a)->peers[rank]) + 64, 0x5a, bytes - 64);
      unchecked_token = static_cast<std::int32_t>(p.seed * 1000 + op);
      const int next = (rank + 1) % world;
      if ((*a)->peers[next] != nullptr) {
        static_cast<std::int32_t*>((*a)->peers[next])[rank] = unchecked_token;
      } else if (!p.unreachable ||
                 !heap->Put(*a, next, rank * sizeof(std::int32_t), &unchecked_token,
                            sizeof(unchecked_token))
                      .ok()) {
        return false;  // every peer is mapped unless the emulation hides them
      }
      unchecked = a->allocation;
      auto at = std::upper_bound(live.begin(), live.end(), *a,
                                 [](const SymmetricHandle& x, const SymmetricHandle& y) {
                                   return x->id < y->id;
                                 });
      live.insert(at, *a);
    } else if (kind < 9) {  // Free one or two, the pair in this member's own order
      const std::size_t n = std::min<std::size_t>(live.size(), 1 + shared() % 2);
      std::vector<SymmetricHandle> victims;
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t i = shared() % live.size();
        if (live[i].allocation == unchecked) continue;  // read back first
        victims.push_back(live[i]);
        live.erase(live.begin() + i);
      }
      std::shuffle(victims.begin(), victims.end(), mine);
      for (const SymmetricHandle& v : victims) {
        if (!heap->Free(v).ok()) return false;
      }
      out << op << " freed " << victims.size() << "\n";
    } else {
      absl::Status s = heap->EmptyCache();
      if (!check()) return false;
      out << op << " empty_cache " << (s.ok() ? "ok" : "failed") << "\n";
    }
  }
  for (const SymmetricHandle& v : live) {
    if (!heap->Free(v).ok()) return false;
  }
  // NVSHMEM's memory goes back only collectively: EmptyCache, retried past
  // the injected faults of its tables (their releases are local).
  if (p.provider == SymmetricProvider::kNvshmem && !heap->EmptyCache().ok()) return false;
  heap.reset();
  return host.LiveResources() == HostResourceCounts{};
}

class SymmetricRandomTest : public ::testing::TestWithParam<Params> {};

TEST_P(SymmetricRandomTest, MembersAgreeOnEveryOutcomeAndSeeEachOthersWrites) {
  const Params p = GetParam();
  const std::string path = SocketPath(absl::StrFormat("random-%d-%d", p.world, p.seed).c_str());
  std::vector<std::string> logs;
  for (int r = 0; r < p.world; ++r) {
    logs.push_back(absl::StrFormat("/tmp/cma-random-%d-%d-%d.log", getpid(), p.seed, r));
  }
  auto codes = RunProcesses(p.world, [&](int r) { return RunMember(p, r, path, logs[r]); });
  EXPECT_THAT(codes, ::testing::Each(0)) << "seed " << p.seed;
  std::vector<std::string> outcomes;
  for (const std::string& log : logs) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    outcomes.push_back(text.str());
    unlink(log.c_str());
  }
  for (int r = 1; r < p.world; ++r) {
    EXPECT_EQ(outcomes[r], outcomes[0]) << "member " << r << " vs member 0, seed " << p.seed;
  }
  // The faults did strike, and the group went on.
  EXPECT_NE(outcomes[0].find("failed"), std::string::npos) << outcomes[0];
  EXPECT_NE(outcomes[0].find(absl::StrCat(kOps - 1, " ")), std::string::npos);
}

constexpr SymmetricProvider kNvshmem = SymmetricProvider::kNvshmem;
INSTANTIATE_TEST_SUITE_P(Seeds, SymmetricRandomTest,
                         ::testing::Values(Params{2, 1}, Params{2, 2}, Params{2, 3},
                                           Params{3, 4}, Params{3, 5}, Params{4, 6},
                                           Params{2, 11, kNvshmem}, Params{3, 12, kNvshmem},
                                           Params{4, 13, kNvshmem}, Params{2, 14, kNvshmem, true},
                                           Params{3, 15, kNvshmem, true}),
                         [](const auto& info) {
                           return absl::StrFormat(
                               "%sworld%d_seed%d%s",
                               info.param.provider == kNvshmem ? "nvshmem_" : "",
                               info.param.world, info.param.seed,
                               info.param.unreachable ? "_unreachable" : "");
                         });

}  // namespace
}  // namespace cma
