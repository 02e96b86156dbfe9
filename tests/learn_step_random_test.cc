// The learned step (learn_step:1) under random training steps on the host
// backend, whose discards zero what they drop: layers of random sizes, an
// optimizer-like last use with state routed to the host or not, steps that
// change shape, routing that comes and goes, parameters re-made. After
// every step the allocator's invariants hold, no allocation failed, and
// every live allocation still holds the bytes written into it (the plan
// moves data, never loses it); the activations are checked before their
// free. A failure prints its seed; LEARN_RANDOM_SEEDS and
// LEARN_RANDOM_FIRST choose the seeds of a longer run.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Live {
  void* p = nullptr;
  std::size_t bytes = 0;
  char fill = 0;
};

class LearnStepRandomTest : public AllocatorTest {
 protected:
  // Writes a pattern the checks below expect: one byte per MiB and the ends.
  Live Fill(std::size_t bytes, char fill, bool routed) {
    if (routed) {
      EXPECT_TRUE(alloc_->SetHostRouting(0, true).ok());
    }
    absl::StatusOr<void*> p = alloc_->Allocate(bytes, 0, s_);
    if (routed) {
      EXPECT_TRUE(alloc_->SetHostRouting(0, false).ok());
    }
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    std::memset(*p, fill, bytes);
    return {*p, bytes, fill};
  }
  void Expect(const Live& l, const char* what) {
    if (l.p == nullptr) return;
    const char* c = static_cast<const char*>(l.p);
    for (std::size_t off = 0; off < l.bytes; off += kMiB) {
      ASSERT_EQ(c[off], l.fill) << what << " at +" << off << " of " << l.bytes;
    }
    ASSERT_EQ(c[l.bytes - 1], l.fill) << what << " at its last byte";
  }
  void Release(Live& l) {
    if (l.p != nullptr) {
      EXPECT_TRUE(alloc_->Free(l.p).ok());
    }
    l.p = nullptr;
  }
  void Use(const std::vector<void*>& ptrs) { ASSERT_TRUE(alloc_->NoteUses(0, ptrs, s_).ok()); }

  void RunSeed(std::uint64_t seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    Make({.device_count = 1, .device_capacity = 256 * kMiB},
         "oversubscribe:1,learn_step:1,managed_budget:2G,device_headroom:96M" + extra_conf_);
    s_ = *backend_->CreateStream(0);
    std::mt19937_64 rng(seed);
    auto mib = [&](int lo, int hi) {  // a size in [lo, hi] MiB, not page-aligned
      return std::uniform_int_distribution<std::size_t>(lo * kMiB, hi * kMiB)(rng);
    };
    auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
    int layers = std::uniform_int_distribution<int>(2, 12)(rng);
    std::vector<Live> params;
    std::vector<std::size_t> acts_bytes;
    char fill = 1;
    for (int i = 0; i < layers; ++i) {
      params.push_back(Fill(mib(1, 16), fill++, false));
      acts_bytes.push_back(mib(1, 16));
    }
    // The optimizer's state: routed to the host (oversubscription's), or not.
    std::vector<Live> state;
    const bool routed_state = chance(0.5);
    if (chance(0.7)) {
      for (int i = 0; i < layers; ++i) state.push_back(Fill(params[i].bytes, fill++, routed_state));
    }
    ASSERT_TRUE(alloc_->MarkIteration(0).ok());
    for (int step = 0; step < 12; ++step) {
      SCOPED_TRACE(testing::Message() << "step " << step);
      if (chance(0.15)) acts_bytes[rng() % layers] = mib(1, 16);  // another shape
      if (chance(0.1)) {  // a parameter made anew
        const int i = static_cast<int>(rng() % layers);
        Release(params[i]);
        params[i] = Fill(mib(1, 16), fill++, false);
      }
      const bool routed_acts = chance(0.1);
      const int run = chance(0.1) ? std::max(1, layers - 1) : layers;  // eval-like
      std::vector<Live> acts;
      for (int i = 0; i < run; ++i) {
        acts.push_back(Fill(acts_bytes[i], fill++, routed_acts));
        std::vector<void*> use = {params[i].p, acts.back().p};
        if (i > 0) use.push_back(acts[i - 1].p);
        Use(use);
      }
      for (int i = run - 1; i >= 0; --i) {
        Use({params[i].p, acts[i].p});
        Expect(acts[i], "an activation");
        Release(acts[i]);
      }
      if (!state.empty()) {
        std::vector<void*> group;
        for (int i = 0; i < layers; ++i) {
          group.push_back(params[i].p);
          group.push_back(state[i].p);
        }
        Use(group);
      }
      ASSERT_TRUE(alloc_->MarkIteration(0).ok());
      ExpectInvariants();
      ASSERT_TRUE(backend_->SynchronizeStream(s_).ok());
      for (const Live& p : params) Expect(p, "a parameter");
      for (const Live& t : state) Expect(t, "optimizer state");
      if (HasFatalFailure()) return;
    }
    // (Placement errors may count: a step with one use larger than the
    // device's part is refused a plan, and runs as without learning.)
    const DeviceStats st = Stats();
    plans_ += st.learned_plans;
    brought_ += st.brought_back_bytes;
    for (Live& p : params) Release(p);
    for (Live& t : state) Release(t);
  }

  // LEARN_RANDOM_SEEDS=N LEARN_RANDOM_FIRST=K run seeds K..K+N-1 (a long run).
  void RunSeeds(std::uint64_t default_seeds) {
    const char* n = std::getenv("LEARN_RANDOM_SEEDS");
    const char* k = std::getenv("LEARN_RANDOM_FIRST");
    const std::uint64_t first = k != nullptr ? std::strtoull(k, nullptr, 10) : 1;
    const std::uint64_t seeds = n != nullptr ? std::strtoull(n, nullptr, 10) : default_seeds;
    for (std::uint64_t seed = first; seed < first + seeds; ++seed) {
      RunSeed(seed);
      if (HasFailure()) break;
    }
    // The seeds exercised the plan: it was made, and data came back.
    EXPECT_GT(plans_, static_cast<std::int64_t>(seeds));
    EXPECT_GT(brought_, 0);
  }

  std::string extra_conf_;
  Stream s_ = 0;
  std::int64_t plans_ = 0, brought_ = 0;  // over every seed
};

TEST_F(LearnStepRandomTest, RandomStepsKeepEveryByteAndTheInvariants) { RunSeeds(40); }

// The same with the bring-backs' calls made by the transfer thread, which
// races the reporting thread's own calls.
TEST_F(LearnStepRandomTest, WithATransferThreadToo) {
  extra_conf_ = ",learn_transfer_thread:1";
  RunSeeds(20);
}

}  // namespace
}  // namespace cma
