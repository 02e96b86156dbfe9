// A device's budget is planned at its first use (DeviceAllocator::PlanBudget),
// not when the allocator is made: bad input before and after that leaves the
// state as it was, and the iteration plan starts at its first mark either
// way. (Found by an adversarial review of the change; each failed on it.)
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr const char* kOver = "oversubscribe:1,device_headroom:8M,managed_budget:200M";

class BudgetPlanningTest : public AllocatorTest {
 protected:
  // 64 MiB device, 8 MiB headroom: 56 MiB device part, 144 MiB host part;
  // the host has 4 GiB available (the host share before planning).
  void MakeOver(const std::string& config = kOver) {
    Make({.device_count = 1,
          .device_capacity = 64 * kMiB,
          .manual_completion = true,
          .host_available = 4 * kGiB},
         config);
  }
};

// A request larger than the device and its host part, made as the device's
// first allocation: bad input, so nothing may change (RELIABILITY.md).
TEST_F(BudgetPlanningTest, TooLargeFirstAllocationOversubscribedChangesNothing) {
  MakeOver();
  const std::string before = Fingerprint(*alloc_);
  auto p = alloc_->Allocate(std::size_t{1} << 30, 0);  // > 64 MiB + 144 MiB, < 64 MiB + 4 GiB
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_THAT(p.status().message(), HasSubstr("exceeds the total memory"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
}

// The same request once the device is planned: the check before the lock
// bounds it by the host share (4 GiB); the exact one must still run.
TEST_F(BudgetPlanningTest, TooLargeAllocationAfterPlanningIsBadInputNotAnOom) {
  MakeOver();
  void* keep = Alloc(kMiB);
  const std::string before = Fingerprint(*alloc_);
  auto p = alloc_->Allocate(std::size_t{1} << 30, 0);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
  EXPECT_THAT(p.status().message(), HasSubstr("exceeds the total memory"));
  EXPECT_EQ(Stats().num_ooms, 0);
  EXPECT_EQ(Fingerprint(*alloc_), before);
  ASSERT_TRUE(alloc_->Free(keep).ok());
}

// The iteration plan (host_plan) starts recording at the first
// MarkIteration, also one made before the device's first allocation (a
// training loop marking each step from step 0).
std::vector<bool> LongLivedOnHost(BudgetPlanningTest* t, CachingManagedAllocator& a, bool plan_first) {
  std::vector<bool> out;
  auto alloc = [&](std::size_t n) {
    auto p = a.Allocate(n, 0);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  };
  if (plan_first) {  // plans the device's budget (PlanBudget) and changes nothing else
    EXPECT_TRUE(a.SetHostRouting(0, true).ok());
    EXPECT_TRUE(a.SetHostRouting(0, false).ok());
  }
  EXPECT_TRUE(a.MarkIteration(0).ok());  // the training loop's first step begins
  for (int it = 0; it < 3; ++it) {
    void* l = alloc(40 * kMiB);
    out.push_back(*a.PlacedOnHost(l));
    for (int i = 0; i < 10; ++i) {
      void* t = alloc(20 * kMiB);
      out.push_back(*a.PlacedOnHost(t));
      EXPECT_TRUE(a.Free(t).ok());
    }
    EXPECT_TRUE(a.Free(l).ok());
    EXPECT_TRUE(a.MarkIteration(0).ok());
  }
  return out;
}

TEST_F(BudgetPlanningTest, AMarkBeforeTheFirstAllocationStartsTheIterationPlan) {
  const std::string config = std::string(kOver) + ",host_plan:1";
  MakeOver(config);
  const std::vector<bool> planned_first = LongLivedOnHost(this, *alloc_, true);
  MakeOver(config);
  const std::vector<bool> marked_first = LongLivedOnHost(this, *alloc_, false);
  EXPECT_EQ(marked_first, planned_first);
}

}  // namespace
}  // namespace cma
