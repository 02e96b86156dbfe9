// HostLedger: one cap for what cma places on the host, shared by the host
// pool (CPU tensors) and oversubscription's host tiers, so that the two never
// count the same host memory twice. Unit tests and the two sides together on
// the host backend.
#include "allocator/host_ledger.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(HostLedgerTest, TakesWithinTheCapOnlyAndGivesBack) {
  HostLedger ledger(100);
  EXPECT_TRUE(ledger.TryTake(60));
  EXPECT_FALSE(ledger.TryTake(41));  // nothing taken
  EXPECT_EQ(ledger.held(), 60u);
  EXPECT_TRUE(ledger.TryTake(40));
  EXPECT_FALSE(ledger.TryTake(1));
  ledger.Give(100);
  EXPECT_FALSE(ledger.TryTake(~std::size_t{0}));  // no overflow past the cap
  EXPECT_EQ(ledger.held(), 0u);
}

TEST(HostLedgerTest, ConcurrentTakersNeverPassTheCap) {
  HostLedger ledger(1000);
  std::vector<std::thread> threads;
  std::atomic<int> taken{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        if (ledger.TryTake(7)) {
          taken.fetch_add(1);
          EXPECT_LE(ledger.held(), 1000u);
          if (i % 2 == 0) {
            ledger.Give(7);
            taken.fetch_sub(1);
          }
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ledger.held(), static_cast<std::size_t>(taken.load()) * 7);
  EXPECT_LE(ledger.held(), 1000u);
}

// A fingerprint without the counters an out-of-memory answer adds to.
std::string WithoutOomCounters(std::string s) {
  for (const char* key : {"host:num_alloc_retries=", "host:num_ooms="}) {
    const std::size_t at = s.find(key);
    if (at != std::string::npos) s.erase(at, s.find(';', at) - at);
  }
  return s;
}

// A host of 64 MiB; a 64 MiB device with 8 MiB of headroom. The host tier's
// part is 64 MiB and the host pool's budget the host's 64 MiB: each alone
// may fill the host, together they may not pass it.
class SharedHostCapTest : public AllocatorTest {
 protected:
  void SetUp() override {
    Make({.device_count = 1,
          .device_capacity = 64 * kMiB,
          .host_available = 64 * kMiB,
          .host_total = 64 * kMiB},
         "oversubscribe:1,device_headroom:8M,managed_budget:120M");
  }
};

TEST_F(SharedHostCapTest, TheHostTierAndTheHostPoolShareTheHostsMemory) {
  ASSERT_TRUE(alloc_->SetHostRouting(0, true).ok());
  void* state = Alloc(40 * kMiB);
  ASSERT_TRUE(*alloc_->PlacedOnHost(state));
  // The host pool alone could hold 32 MiB; with 40 MiB in the host tier it
  // may not, and nothing but the out-of-memory counters changes.
  const std::string before = WithoutOomCounters(Fingerprint(*alloc_));
  auto cpu = alloc_->Allocate(32 * kMiB, CachingManagedAllocator::kHostDevice);
  ASSERT_TRUE(absl::IsResourceExhausted(cpu.status())) << cpu.status();
  EXPECT_THAT(cpu.status().message(), HasSubstr("host tier"));
  EXPECT_EQ(alloc_->GetHostStats().num_ooms, 1);
  EXPECT_EQ(WithoutOomCounters(Fingerprint(*alloc_)), before);
  // Once the tier gives its memory back, the pool may.
  ASSERT_TRUE(alloc_->Free(state).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  cpu = alloc_->Allocate(32 * kMiB, CachingManagedAllocator::kHostDevice);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  // And the other way: with 32 MiB of CPU tensors, 40 MiB routed to the host
  // is not placed there.
  auto routed = alloc_->Allocate(40 * kMiB, 0);
  if (routed.ok()) {
    EXPECT_FALSE(*alloc_->PlacedOnHost(*routed)) << "placed past the host's memory";
    ASSERT_TRUE(alloc_->Free(*routed).ok());
  } else {
    EXPECT_THAT(routed.status().message(), HasSubstr("host"));
  }
  ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
  ASSERT_TRUE(alloc_->Free(*cpu).ok());
}

TEST_F(SharedHostCapTest, EachSideReclaimsTheOthersIdleMemory) {
  // 40 MiB routed to the host and freed stays cached in the host tier; a
  // 32 MiB CPU tensor needs it back, and gets it.
  ASSERT_TRUE(alloc_->SetHostRouting(0, true).ok());
  void* state = Alloc(40 * kMiB);
  ASSERT_TRUE(*alloc_->PlacedOnHost(state));
  ASSERT_TRUE(alloc_->Free(state).ok());
  EXPECT_EQ(Stats().host_resident_bytes[kAllPools].current, 40 * static_cast<int64_t>(kMiB));
  auto cpu = alloc_->Allocate(32 * kMiB, CachingManagedAllocator::kHostDevice);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ(Stats().host_resident_bytes[kAllPools].current, 0);
  // And the other way: the CPU tensor freed stays cached in the host pool;
  // 40 MiB routed to the host needs it back, and gets it.
  ASSERT_TRUE(alloc_->Free(*cpu).ok());
  EXPECT_EQ(alloc_->GetHostStats().reserved_bytes.current, 32 * static_cast<int64_t>(kMiB));
  void* again = Alloc(40 * kMiB);
  EXPECT_TRUE(*alloc_->PlacedOnHost(again));
  EXPECT_EQ(alloc_->GetHostStats().reserved_bytes.current, 0);
  ASSERT_TRUE(alloc_->Free(again).ok());
  ASSERT_TRUE(alloc_->SetHostRouting(0, false).ok());
}

}  // namespace
}  // namespace cma
