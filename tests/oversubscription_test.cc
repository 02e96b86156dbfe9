// Oversubscription (config oversubscribe:1, policy/oversubscription.h) on the
// host backend: the budget's split, the host tier that takes what does not
// fit the device's part, its reuse, routing, errors, and the mode off.
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "policy/host_plan.h"
#include "policy/oversubscription.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
using Op = PlacementRecord::Op;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

AllocatorConfig Config(const std::string& text) {
  absl::StatusOr<AllocatorConfig> c = ParseAllocatorConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(TierBudgetsTest, OffKeepsTheBudgetAsBefore) {
  TierBudgets b = *PlanTierBudgets(Config("managed_budget:0.5"), 0, 8 * kGiB, 64 * kGiB);
  EXPECT_EQ(b.device, 4 * kGiB);
  EXPECT_EQ(b.host, 0u);
  // An absolute budget above the device leaves placement to the driver.
  b = *PlanTierBudgets(Config("managed_budget:20G"), 0, 8 * kGiB, 64 * kGiB);
  EXPECT_EQ(b.device, 20 * kGiB);
  EXPECT_EQ(b.host, 0u);
}

TEST(TierBudgetsTest, OnSplitsTheTotalIntoDeviceAndHost) {
  TierBudgets b =
      *PlanTierBudgets(Config("oversubscribe:1,managed_budget:20G"), 0, 8 * kGiB, 64 * kGiB);
  EXPECT_EQ(b.device, 7 * kGiB);  // less the default 1G headroom
  EXPECT_EQ(b.host, 13 * kGiB);
  // Default total: the device's free memory and half of the host's.
  b = *PlanTierBudgets(Config("oversubscribe:1,device_headroom:512M"), 0, 8 * kGiB, 64 * kGiB);
  EXPECT_EQ(b.device, 8 * kGiB - 512 * kMiB);
  EXPECT_EQ(b.host, 40 * kGiB - b.device);
  // A total within the device's part places nothing on the host.
  b = *PlanTierBudgets(Config("oversubscribe:1,managed_budget:2G"), 0, 8 * kGiB, 64 * kGiB);
  EXPECT_EQ(b.device, 2 * kGiB);
  EXPECT_EQ(b.host, 0u);
}

TEST(TierBudgetsTest, ATotalBeyondDeviceAndHostNamesBoth) {
  absl::StatusOr<TierBudgets> b =
      PlanTierBudgets(Config("oversubscribe:1,managed_budget:100G"), 3, 8 * kGiB, 64 * kGiB);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("device 3 has 8.00 GiB free"));
  EXPECT_THAT(b.status().message(), HasSubstr("the host 64.00 GiB available"));
  b = PlanTierBudgets(Config("oversubscribe:1,device_headroom:8G"), 0, 8 * kGiB, 64 * kGiB);
  ASSERT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("device_headroom"));
}

TEST(TierBudgetsTest, TheModeNeedsArenas) {
  absl::StatusOr<AllocatorConfig> c = ParseAllocatorConfig("oversubscribe:1,segments:classic");
  ASSERT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("segments:arena"));
  EXPECT_EQ(Config("oversubscribe:1,device_headroom:64M,host_plan:1").ToString(),
            "oversubscribe:1,host_plan:1,device_headroom:67108864");
}

// ---- the iteration plan (policy/host_plan.h) ----

TEST(HostPlanTest, TheLongLivedAllocationGoesRatherThanEveryTemporary) {
  // 50 bytes resident, a long-lived 40 from event 1 to 20, then 30-byte
  // temporaries one after another: by allocation order each temporary
  // would go to the host; the plan moves the long-lived one alone.
  const std::vector<Lifetime> carried = {{50, 0, Lifetime::kNeverFreed}};
  std::vector<Lifetime> own = {{40, 1, 20}};
  for (int t = 2; t < 18; t += 2) own.push_back({30, t, t + 1});
  const std::vector<bool> host = PlanHostPlacement(own, carried, 100);
  ASSERT_EQ(host.size(), own.size());
  EXPECT_TRUE(host[0]);
  for (std::size_t i = 1; i < own.size(); ++i) EXPECT_FALSE(host[i]) << i;
}

TEST(HostPlanTest, WhatOutlivesTheIterationGoesFirstAndOnlyWhatIsNeeded) {
  const std::vector<Lifetime> own = {{40, 0, Lifetime::kNeverFreed}, {40, 1, 5}, {40, 2, 3}};
  EXPECT_EQ(PlanHostPlacement(own, {}, 100), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(PlanHostPlacement(own, {}, 120), (std::vector<bool>{false, false, false}));
  // A carried allocation freed early makes room for the rest.
  const std::vector<Lifetime> carried = {{60, 0, 1}};
  const std::vector<Lifetime> later = {{50, 2, 10}, {40, 3, 4}};
  EXPECT_EQ(PlanHostPlacement(later, carried, 100), (std::vector<bool>{false, false}));
}

TEST(HostPlanTest, FixedAllocationsOverTheCapacitySendEveryChoosableOneToTheHost) {
  const std::vector<Lifetime> carried = {{150, 0, Lifetime::kNeverFreed}};
  const std::vector<Lifetime> own = {{10, 1, 2}, {10, 3, 4}};
  EXPECT_EQ(PlanHostPlacement(own, carried, 100), (std::vector<bool>{true, true}));
  EXPECT_TRUE(PlanHostPlacement({}, carried, 100).empty());
}

// A 64 MiB device with 8 MiB of headroom: 56 MiB for the device's part,
// 200 MiB in all.
class OversubscriptionTest : public AllocatorTest {
 protected:
  void SetUp() override { Remake("oversubscribe:1,device_headroom:8M,managed_budget:200M"); }
  void Remake(const std::string& config) {
    Make({.device_count = 1,
          .device_capacity = 64 * kMiB,
          .manual_completion = true,
          .host_available = 4 * kGiB},
         config);
    s1_ = *backend_->CreateStream(0);
    s2_ = *backend_->CreateStream(0);
  }
  void TearDown() override {
    AllocatorTest::TearDown();
    if (backend_) {
      (void)backend_->DestroyStream(s1_);
      (void)backend_->DestroyStream(s2_);
    }
  }
  bool OnHost(void* p) { return *alloc_->PlacedOnHost(p); }
  int DevicePages(void* p, std::size_t n) {
    int on_device = 0;
    for (std::size_t off = 0; off < n; off += 2 * kMiB) {
      on_device += backend_->PageLocation(static_cast<char*>(p) + off) >= 0;
    }
    return on_device;
  }
  Stream s1_ = 0, s2_ = 0;
};

TEST_F(OversubscriptionTest, WhatDoesNotFitTheDeviceLivesOnTheHost) {
  void* a = Alloc(40 * kMiB, 0, s1_);  // the device's first use plans its two parts
  EXPECT_EQ(Stats().managed_budget_bytes, static_cast<std::int64_t>(56 * kMiB));
  EXPECT_EQ(Stats().host_budget_bytes, static_cast<std::int64_t>(144 * kMiB));
  EXPECT_FALSE(OnHost(a));
  backend_->ClearRecords();
  void* b = Alloc(24 * kMiB, 0, s1_);  // past the device's part
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(OnHost(b));
  // None of its pages on the device (the emulation leaves a page that was
  // never touched unpopulated where a prefetch to the host names it).
  for (std::size_t off = 0; off < 24 * kMiB; off += 2 * kMiB) {
    EXPECT_LT(backend_->PageLocation(static_cast<char*>(b) + off), 0);
  }
  // Preferred on the host and mapped for the device: no fault migrates it.
  bool preferred_host = false, accessed_by_device = false;
  for (const PlacementRecord& r : backend_->Records()) {
    if (r.op != Op::kAdvise || r.ptr != b) continue;
    preferred_host |= r.advice == Advice::kSetPreferredLocation && r.location.is_host();
    accessed_by_device |= r.advice == Advice::kSetAccessedBy && r.location == Location::Device(0);
  }
  EXPECT_TRUE(preferred_host);
  EXPECT_TRUE(accessed_by_device);
  EXPECT_EQ(Stats().host_resident_bytes[kAllPools].current, static_cast<std::int64_t>(24 * kMiB));
  EXPECT_EQ(Stats().num_host_placements, 1);
  EXPECT_EQ(Stats().host_overflow_bytes, static_cast<std::int64_t>(24 * kMiB));
  // The device's memory counts only what lives there.
  EXPECT_LE(Stats().reserved_bytes[kAllPools].current, static_cast<std::int64_t>(56 * kMiB));
  std::memset(b, 0x3c, 24 * kMiB);
  EXPECT_EQ(static_cast<unsigned char*>(b)[24 * kMiB - 1], 0x3c);
  ExpectInvariants();
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
}

TEST_F(OversubscriptionTest, TheSteadyStateReusesHostBlocksWithNoCall) {
  void* a = Alloc(50 * kMiB, 0, s1_);
  void* b = Alloc(20 * kMiB, 0, s1_);
  ASSERT_TRUE(OnHost(b));
  ASSERT_TRUE(alloc_->Free(b).ok());
  const std::int64_t segments = Stats().num_device_alloc;
  const std::int64_t syncs = backend_->CallCount("SynchronizeStream");
  backend_->ClearRecords();
  for (int step = 0; step < 5; ++step) {
    void* again = Alloc(20 * kMiB, 0, s1_);
    EXPECT_EQ(again, b);
    ASSERT_TRUE(alloc_->Free(again).ok());
  }
  EXPECT_EQ(Stats().num_device_alloc, segments);
  EXPECT_EQ(backend_->CallCount("SynchronizeStream"), syncs);
  EXPECT_TRUE(backend_->Records().empty()) << "no advice, prefetch or discard";
  EXPECT_EQ(Stats().num_host_placements, 6);
  EXPECT_EQ(Stats().host_overflow_bytes, static_cast<std::int64_t>(6 * 20 * kMiB));
  ASSERT_TRUE(alloc_->Free(a).ok());
  // Empty, the cache gives the host memory back too.
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(Stats().host_resident_bytes[kAllPools].current, 0);
}

TEST_F(OversubscriptionTest, AHostBlockUsedOnAnotherStreamWaitsForThatStream) {
  void* a = Alloc(50 * kMiB, 0, s1_);
  void* b = Alloc(20 * kMiB, 0, s1_);
  ASSERT_TRUE(OnHost(b));
  ASSERT_TRUE(alloc_->RecordStream(b, s2_).ok());
  ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());  // a kernel on s2 still reads b
  ASSERT_TRUE(alloc_->Free(b).ok());
  void* c = Alloc(20 * kMiB, 0, s1_);
  // Reused only after the out-of-memory retry waited for s2's work.
  if (c == b) EXPECT_TRUE(*backend_->QueryStream(s2_)) << "handed out while s2 may use it";
  for (void* p : {a, c}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(OversubscriptionTest, BeyondTheHostPartIsOutOfMemoryAndChangesNothing) {
  void* a = Alloc(50 * kMiB, 0, s1_);
  void* b = Alloc(140 * kMiB, 0, s1_);
  ASSERT_TRUE(OnHost(b));
  const DeviceStats before = Stats();
  absl::StatusOr<void*> c = alloc_->Allocate(8 * kMiB, 0, s1_);
  ASSERT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("host part of device 0's managed budget"));
  EXPECT_EQ(Stats().host_resident_bytes[kAllPools].current,
            before.host_resident_bytes[kAllPools].current);
  EXPECT_EQ(Stats().active_bytes[kAllPools].current, before.active_bytes[kAllPools].current);
  EXPECT_EQ(Stats().num_ooms, before.num_ooms + 1);
  ASSERT_TRUE(alloc_->Free(b).ok());
  ASSERT_TRUE(alloc_->Free(a).ok());
}

TEST_F(OversubscriptionTest, RoutingPlacesOnTheHostUntilTurnedOff) {
  ASSERT_TRUE(alloc_->SetHostRouting(0, true).ok());
  void* state = Alloc(4 * kMiB, 0, s1_);
  EXPECT_TRUE(OnHost(state)) << "routed, though the device has room";
  EXPECT_EQ(Stats().host_overflow_bytes, 0) << "routed, not overflowed";
  ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
  void* act = Alloc(4 * kMiB, 0, s1_);
  EXPECT_FALSE(OnHost(act));
  EXPECT_EQ(alloc_->SetHostRouting(0, false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(alloc_->SetHostRouting(5, true).code(), absl::StatusCode::kInvalidArgument);
  int local = 0;
  EXPECT_EQ(alloc_->PlacedOnHost(&local).status().code(), absl::StatusCode::kInvalidArgument);
  for (void* p : {state, act}) ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(OversubscriptionTest, ARequestLargerThanTheDeviceGoesToTheHost) {
  void* big = Alloc(100 * kMiB, 0, s1_);
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(OnHost(big));
  ASSERT_TRUE(alloc_->Free(big).ok());
}

TEST_F(OversubscriptionTest, OffTheSameWorkIsOutOfMemory) {
  Remake("managed_budget:56M");
  void* a = Alloc(40 * kMiB, 0, s1_);
  absl::StatusOr<void*> b = alloc_->Allocate(24 * kMiB, 0, s1_);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Stats().host_resident_bytes[kAllPools].current, 0);
  EXPECT_EQ(alloc_->SetHostRouting(0, true).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(alloc_->Free(a).ok());
}

// A repeating iteration: a long-lived 30 MiB allocation, then ten 20 MiB
// temporaries one after another, beside 10 MiB resident, on a device whose
// part is 56 MiB. By allocation order every temporary lives on the host;
// once an iteration is recorded, the next places the long-lived one there
// instead, and the temporaries on the device.
TEST_F(OversubscriptionTest, TheNextIterationFollowsThePlanLearntFromTheLast) {
  Remake("oversubscribe:1,device_headroom:8M,managed_budget:200M,host_plan:1");
  void* resident = Alloc(10 * kMiB, 0, s1_);
  std::vector<bool> temporaries_on_host;
  bool long_lived_on_host = false;
  auto iteration = [&] {
    temporaries_on_host.clear();
    void* a = Alloc(30 * kMiB, 0, s1_);
    long_lived_on_host = OnHost(a);
    for (int t = 0; t < 10; ++t) {
      void* tmp = Alloc(20 * kMiB, 0, s1_);
      temporaries_on_host.push_back(OnHost(tmp));
      ASSERT_TRUE(alloc_->Free(tmp).ok());
    }
    ASSERT_TRUE(alloc_->Free(a).ok());
    ASSERT_TRUE(alloc_->MarkIteration(0).ok());
  };
  iteration();  // recorded from its end on
  iteration();  // recorded: allocation order
  EXPECT_FALSE(long_lived_on_host);
  EXPECT_EQ(std::count(temporaries_on_host.begin(), temporaries_on_host.end(), true), 10);
  const std::int64_t before = Stats().num_host_placements;
  iteration();  // planned
  EXPECT_TRUE(long_lived_on_host);
  EXPECT_EQ(std::count(temporaries_on_host.begin(), temporaries_on_host.end(), true), 0);
  EXPECT_EQ(Stats().num_host_placements - before, 1);
  iteration();  // the plan holds in the steady state
  EXPECT_TRUE(long_lived_on_host);
  EXPECT_EQ(std::count(temporaries_on_host.begin(), temporaries_on_host.end(), true), 0);
  // A different request ends the plan: allocation order again.
  void* other = Alloc(12 * kMiB, 0, s1_);
  EXPECT_FALSE(OnHost(other));
  ASSERT_TRUE(alloc_->Free(other).ok());
  ASSERT_TRUE(alloc_->Free(resident).ok());
  EXPECT_EQ(alloc_->MarkIteration(3).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(OversubscriptionTest, WithoutHostPlanAllocationOrderDecides) {
  for (int i = 0; i < 3; ++i) {
    void* a = Alloc(50 * kMiB, 0, s1_);
    void* t = Alloc(20 * kMiB, 0, s1_);
    EXPECT_FALSE(OnHost(a));
    EXPECT_TRUE(OnHost(t));
    for (void* p : {t, a}) ASSERT_TRUE(alloc_->Free(p).ok());
    ASSERT_TRUE(alloc_->MarkIteration(0).ok());
  }
}

// Sleep and Wake leave the host tier where it is: nothing counts it on the
// device (found by review).
TEST_F(OversubscriptionTest, SleepAndWakeLeaveHostBlocksOnTheHost) {
  void* a = Alloc(50 * kMiB, 0, s1_);
  void* b = Alloc(20 * kMiB, 0, s1_);
  ASSERT_TRUE(OnHost(b));
  std::memset(b, 0x5c, 20 * kMiB);
  for (SleepLevel level : {SleepLevel::kMigrate, SleepLevel::kOffload, SleepLevel::kDiscard}) {
    ASSERT_TRUE(alloc_->Sleep(0, s1_, level).ok());
    ASSERT_TRUE(alloc_->Wake(0, s1_).ok());
    ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
    EXPECT_EQ(DevicePages(b, 20 * kMiB), 0) << "level " << static_cast<int>(level);
    EXPECT_EQ(static_cast<unsigned char*>(b)[20 * kMiB - 1], 0x5c) << "even a level-2 sleep";
  }
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(b).ok());
}

// A move of a host block to its own device or the host changes nothing (it
// is mapped for the device already); to another device it is refused.
TEST_F(OversubscriptionTest, AMoveLeavesAHostBlockOnTheHost) {
  void* a = Alloc(50 * kMiB, 0, s1_);
  void* b = Alloc(20 * kMiB, 0, s1_);
  ASSERT_TRUE(OnHost(b));
  ASSERT_TRUE(alloc_->Move(b, Location::Device(0), s1_).ok());
  ASSERT_TRUE(alloc_->Move(b, Location::Host(), s1_).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  EXPECT_EQ(DevicePages(b, 20 * kMiB), 0);
  ASSERT_TRUE(alloc_->Free(b).ok());
  void* c = Alloc(20 * kMiB, 0, s1_);
  ASSERT_EQ(c, b);
  EXPECT_TRUE(OnHost(c));
  EXPECT_EQ(DevicePages(c, 20 * kMiB), 0);
  ASSERT_TRUE(alloc_->Free(a).ok());
  ASSERT_TRUE(alloc_->Free(c).ok());
}

// Out of memory on the host tier first gives the cached host blocks back,
// also those of a forgotten stream, which any stream may then reuse.
TEST_F(OversubscriptionTest, AHostOutOfMemoryReleasesCachedHostBlocksFirst) {
  ASSERT_TRUE(alloc_->SetHostRouting(0, true).ok());
  void* b = Alloc(100 * kMiB, 0, s1_);
  ASSERT_TRUE(alloc_->Free(b).ok());  // cached: 100 of the 144 MiB host part
  void* c = Alloc(60 * kMiB, 0, s1_);
  EXPECT_TRUE(OnHost(c));
  ASSERT_TRUE(alloc_->Free(c).ok());
  ASSERT_TRUE(alloc_->ForgetStream(s1_).ok());
  void* d = Alloc(100 * kMiB, 0, s2_);
  EXPECT_TRUE(OnHost(d));
  ASSERT_TRUE(alloc_->Free(d).ok());
  ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
}

// PyTorch's set_per_process_memory_fraction(0) refuses every allocation,
// oversubscribed too.
TEST_F(OversubscriptionTest, MemoryFractionZeroRefusesEverything) {
  ASSERT_TRUE(alloc_->SetMemoryFraction(0.0, 0).ok());
  EXPECT_EQ(alloc_->Allocate(4 * kMiB, 0, s1_).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Advice on a host block would undo the tier's own (withdrawn at the free,
// the cached block would no longer be preferred on the host): refused.
TEST_F(OversubscriptionTest, AdviceOnAHostBlockIsRefusedAndTheTiersAdviceStays) {
  ASSERT_TRUE(alloc_->SetHostRouting(0, true).ok());
  void* b = Alloc(8 * kMiB, 0, s1_);
  AllocationHints h;
  h.preferred_location = Location::Host();
  EXPECT_EQ(alloc_->SetHints(b, h).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(alloc_->Free(b).ok());
  void* c = Alloc(8 * kMiB, 0, s1_);
  ASSERT_EQ(c, b);
  absl::StatusOr<RangeAttributes> at = backend_->GetRangeAttributes(c, 8 * kMiB);
  ASSERT_TRUE(at.ok());
  EXPECT_TRUE(at->has_preferred_location && at->preferred_location.is_host());
  EXPECT_EQ(at->accessed_by, std::vector<int>{0});
  ASSERT_TRUE(alloc_->Free(c).ok());
  ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
}

// Randomized, three streams with pending work, the device's part small
// enough that the host tier serves often: after every step no allocation
// overlaps another, every live one keeps its tag, and memory freed while a
// stream other than its next user had work queued on it is handed out only
// once that work has completed (an event recorded at the free says so).
TEST_F(OversubscriptionTest, RandomizedReuseNeverRacesAnotherStream) {
  struct Live {
    std::size_t size;
    Stream stream;
    std::vector<Stream> uses;
    unsigned char tag;
  };
  struct Freed {
    std::uintptr_t lo, hi;
    std::vector<std::pair<Stream, Event>> pending;  // (stream, its position at the free)
  };
  static constexpr std::size_t kSizes[] = {4096, 700 * 1024, 3 * kMiB, 9 * kMiB, 21 * kMiB};
  for (std::uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    const Stream streams[3] = {s1_, s2_, *backend_->CreateStream(0)};
    std::map<std::uintptr_t, Live> live;
    std::vector<Freed> freed;
    unsigned char next_tag = 1;
    int routed = 0;
    for (int step = 0; step < 1500; ++step) {
      const int op = static_cast<int>(rng() % 100);
      const Stream st = streams[rng() % 3];
      if (op < 35) {
        absl::StatusOr<void*> got = alloc_->Allocate(kSizes[rng() % 5], 0, st);
        if (!got.ok()) {
          ASSERT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
          continue;
        }
        const auto lo = reinterpret_cast<std::uintptr_t>(*got);
        const std::size_t size = *alloc_->RequestedSize(*got);
        for (const auto& [p, l] : live) {
          ASSERT_TRUE(lo + size <= p || p + l.size <= lo) << "overlaps a live allocation";
        }
        for (const Freed& f : freed) {
          if (lo >= f.hi || lo + size <= f.lo) continue;
          for (const auto& [x, e] : f.pending) {
            if (x == st) continue;  // ordered by the stream itself
            ASSERT_TRUE(*backend_->QueryEvent(e)) << "handed out while stream " << x
                                                  << " may still use it (step " << step << ")";
          }
        }
        live[lo] = {size, st, {}, next_tag};
        std::memset(*got, next_tag, 1);
        static_cast<unsigned char*>(*got)[size - 1] = next_tag;
        next_tag = static_cast<unsigned char>(next_tag % 250 + 1);
      } else if (op < 65 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        Freed f{it->first, it->first + it->second.size, {}};
        std::vector<Stream> users = it->second.uses;
        users.push_back(it->second.stream);
        for (Stream u : users) {
          Event e = *backend_->CreateEvent(0);
          ASSERT_TRUE(backend_->RecordEvent(e, u).ok());
          f.pending.push_back({u, e});
        }
        ASSERT_TRUE(alloc_->Free(reinterpret_cast<void*>(it->first)).ok());
        live.erase(it);
        freed.push_back(std::move(f));
      } else if (op < 75 && !live.empty()) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_TRUE(alloc_->RecordStream(reinterpret_cast<void*>(it->first), st).ok());
        it->second.uses.push_back(st);
      } else if (op < 87) {
        ASSERT_TRUE(backend_->EnqueueWork(st).ok());
      } else if (op < 96) {
        ASSERT_TRUE(backend_->CompleteWork(st).ok());
      } else if (op < 98) {
        ASSERT_TRUE(alloc_->SetHostRouting(0, routed == 0).ok());
        routed = 1 - routed;
      } else {
        ASSERT_TRUE(alloc_->EmptyCache().ok());
      }
      for (const auto& [p, l] : live) {
        ASSERT_EQ(*reinterpret_cast<unsigned char*>(p), l.tag) << "step " << step;
        ASSERT_EQ(*reinterpret_cast<unsigned char*>(p + l.size - 1), l.tag) << "step " << step;
      }
      if (step % 100 == 0) ASSERT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    }
    EXPECT_GT(Stats().num_host_placements, 0);
    if (routed) ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
    for (const auto& [p, l] : live) ASSERT_TRUE(alloc_->Free(reinterpret_cast<void*>(p)).ok());
    for (Stream s : streams) ASSERT_TRUE(backend_->CompleteWork(s).ok());
    for (const Freed& f : freed) {
      for (const auto& [x, e] : f.pending) ASSERT_TRUE(backend_->DestroyEvent(e).ok());
    }
    ASSERT_TRUE(alloc_->EmptyCache().ok());
    ASSERT_TRUE(alloc_->ForgetStream(streams[2]).ok());
    ASSERT_TRUE(backend_->DestroyStream(streams[2]).ok());
  }
}

TEST(OversubscriptionCreateTest, ABudgetNoMemoryCanHoldIsRefusedNamingBoth) {
  HostBackend backend({.device_count = 1, .device_capacity = 64 * kMiB, .host_available = kGiB});
  auto a = CachingManagedAllocator::Create(backend, "oversubscribe:1,device_headroom:8M,"
                                                    "managed_budget:2G");
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("host 1.00 GiB available"));
}

}  // namespace
}  // namespace cma
