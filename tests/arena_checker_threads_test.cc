// The checker's step language from several threads at once on one allocator
// (run under TSAN in CI): alloc, free, record_stream, work and completion on
// each thread's own streams, zero-copy moves, disposable blocks, sleep and
// wake, empty_cache, memory fractions, forgetting and re-creating a stream,
// statistics and snapshots. The shadow model of the single-threaded checker
// needs one order of events, so here every live block carries a tag that
// another thread's misplaced block or a wrong discard would overwrite, and
// the invariants and the accounting are checked when the threads are done.
// A staging Sleep (level 1) leaves contents reachable only through Wake or
// Move, so the host touches tags (writing after an allocation, checking
// before a free) only under a shared lock that sleep and wake take alone,
// and checks them only while awake.
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Tagged {
  void* p;
  std::size_t n;
  std::uint64_t tag;
  bool checked;  // false once its contents may legitimately be gone
};

void Write(const Tagged& t) {
  for (std::size_t off : {std::size_t{0}, t.n / 2, t.n - 1}) {
    static_cast<std::uint8_t*>(t.p)[off] = static_cast<std::uint8_t>(1 + (t.tag + off) % 255);
  }
}

bool Intact(const Tagged& t) {
  for (std::size_t off : {std::size_t{0}, t.n / 2, t.n - 1}) {
    if (static_cast<const std::uint8_t*>(t.p)[off] != 1 + (t.tag + off) % 255) return false;
  }
  return true;
}

TEST_F(AllocatorTest, CheckerStepsFromFourThreadsKeepEveryTagAndInvariant) {
  for (const char* config : {"", "idle_page_slack:0,arena_size:32M", "segments:classic"}) {
    SCOPED_TRACE(config);
    Make({.device_count = 1, .device_capacity = 256 * kMiB, .manual_completion = true}, config);
    constexpr int kThreads = 4;
    constexpr int kSteps = 1500;
    std::atomic<int> failures{0};
    std::atomic<std::uint64_t> next_tag{1};
    std::shared_mutex phase_mu;  // exclusive: sleep and wake; shared: tag reads and writes
    bool asleep = false;           // guarded by phase_mu
    auto worker = [&](int id) {
      std::mt19937_64 rng(77 + id);
      Stream own[2] = {*backend_->CreateStream(0), *backend_->CreateStream(0)};
      std::vector<Tagged> live;
      for (int step = 0; step < kSteps && failures == 0; ++step) {
        const Stream s = own[rng() % 2];
        const int op = rng() % 100;
        if (op < 35 || live.empty()) {
          const std::size_t n = rng() % 4 == 0 ? kMiB + rng() % (12 * kMiB) : 1 + rng() % 65536;
          std::shared_lock<std::shared_mutex> phase(phase_mu);
          auto p = alloc_->Allocate(n, 0, s);
          if (!p.ok()) {
            if (!absl::IsResourceExhausted(p.status())) ++failures;
            continue;
          }
          Tagged t{*p, n, next_tag++, true};
          Write(t);
          live.push_back(t);
        } else if (op < 60) {
          const std::size_t i = rng() % live.size();
          std::shared_lock<std::shared_mutex> phase(phase_mu);
          if (!asleep && live[i].checked && !Intact(live[i])) {
            ADD_FAILURE() << "thread " << id << ": contents of " << live[i].p << " changed";
            ++failures;
          }
          if (!alloc_->Free(live[i].p).ok()) ++failures;
          live[i] = live.back();
          live.pop_back();
        } else if (op < 68) {
          if (!backend_->EnqueueWork(s).ok()) ++failures;
        } else if (op < 76) {
          if (!backend_->CompleteWork(s).ok()) ++failures;
        } else if (op < 80) {
          if (!alloc_->RecordStream(live[rng() % live.size()].p, own[rng() % 2]).ok()) ++failures;
        } else if (op < 84) {
          Tagged& t = live[rng() % live.size()];
          const bool dead = rng() % 3 == 0;
          const Location where = rng() % 2 ? Location::Host() : Location::Device(0);
          std::shared_lock<std::shared_mutex> phase(phase_mu);
          if (!alloc_->Move(t.p, where, s, dead).ok()) ++failures;
          if (dead) Write(t);  // the owner rewrites what it declared dead
        } else if (op < 86) {
          Tagged& t = live[rng() % live.size()];
          if (!alloc_->SetDisposable(t.p, true).ok()) ++failures;
          t.checked = false;
        } else if (op < 88) {
          // One thread at a time changes the sleep state, staging or
          // migrating.
          std::unique_lock<std::shared_mutex> phase(phase_mu);
          const SleepLevel level = rng() % 2 ? SleepLevel::kOffload : SleepLevel::kMigrate;
          auto r = asleep ? alloc_->Wake(0, s) : alloc_->Sleep(0, s, level);
          if (!r.ok()) ++failures;
          asleep = !asleep;
        } else if (op < 90) {
          if (!alloc_->EmptyCache().ok()) ++failures;
        } else if (op < 92) {
          static constexpr double kFractions[] = {0.125, 0.5, 1.0};
          if (!alloc_->SetMemoryFraction(kFractions[rng() % 3], 0).ok()) ++failures;
        } else if (op < 94) {
          // Forget one of this thread's streams (its blocks stay valid) and
          // replace it.
          const int k = static_cast<int>(rng() % 2);
          if (!alloc_->ForgetStream(own[k]).ok() || !backend_->DestroyStream(own[k]).ok()) {
            ++failures;
          }
          own[k] = *backend_->CreateStream(0);
        } else if (op < 97) {
          if (!alloc_->GetStats(0).ok()) ++failures;
          (void)alloc_->Snapshot();
        } else {
          if (!alloc_->CheckInvariants().ok()) {
            ADD_FAILURE() << alloc_->CheckInvariants();
            ++failures;
          }
        }
      }
      for (const Tagged& t : live) {
        std::shared_lock<std::shared_mutex> phase(phase_mu);
        if (!asleep && t.checked && !Intact(t)) ++failures;
        if (!alloc_->Free(t.p).ok()) ++failures;
      }
      for (Stream st : own) {
        if (!alloc_->ForgetStream(st).ok() || !backend_->DestroyStream(st).ok()) ++failures;
      }
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures.load(), 0);
    // The threads ran their steps: about a third of them allocate.
    EXPECT_GT(Stats().allocation[kAllPools].allocated, kThreads * kSteps / 5);
    ExpectInvariants();
    if (asleep) {
      ASSERT_TRUE(alloc_->Wake(0, kDefaultStream).ok());
    }
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
    EXPECT_EQ(Stats().num_placement_errors, 0);
    EXPECT_EQ(backend_->PopulatedBytes(0), 0u);
  }
}

}  // namespace
}  // namespace cma
