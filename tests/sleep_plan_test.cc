// The page arithmetic of a Sleep (allocator/sleep_plan.h) on made-up
// addresses: nothing is dereferenced.
#include "allocator/sleep_plan.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "policy/size_policy.h"

namespace cma {
namespace {

constexpr std::uintptr_t kBase = std::uintptr_t{1} << 40;  // page-aligned
constexpr std::size_t kMiB = std::size_t{1} << 20;

Range At(std::size_t offset, std::size_t bytes) {
  return {reinterpret_cast<void*>(kBase + offset), bytes};
}
std::size_t Off(const Range& r) { return reinterpret_cast<std::uintptr_t>(r.ptr) - kBase; }

TEST(PagesToDiscardTest, RoundsOutMergesAndLeavesEveryPageSomethingStayingTouches) {
  // Parts [1M, 5M) and [5M, 6M) round out to pages [0, 6M); a migrating
  // range at [8M+1, 8M+2) keeps page [8M, 10M) of the part [7M, 12M).
  auto pages = PagesToDiscard({At(1 * kMiB, 4 * kMiB), At(5 * kMiB, 1 * kMiB),
                               At(7 * kMiB, 5 * kMiB)},
                              {At(8 * kMiB + 1, 1)});
  ASSERT_EQ(pages.size(), 2u);
  EXPECT_EQ(Off(pages[0]), 0u);
  EXPECT_EQ(pages[0].bytes, 8 * kMiB);  // [0, 6M) and [6M, 8M) merged
  EXPECT_EQ(Off(pages[1]), 10 * kMiB);
  EXPECT_EQ(pages[1].bytes, 2 * kMiB);
  // Empty parts discard nothing.
  EXPECT_TRUE(PagesToDiscard({At(0, 0)}, {}).empty());
}

TEST(PlanRestoreTest, WholePagesAreRepopulatedSharedOnesOnlyPrefetchedCopiesMerged) {
  // Two adjacent parts staged back to back, [1M, 5M) at 0 and [5M, 6M) at
  // 4M: one copy; then [9M, 9M+4K) at 64M, alone on page [8M, 10M).
  RestorePlan plan = PlanRestore({{At(9 * kMiB, 4096), 64 * kMiB},
                                  {At(5 * kMiB, kMiB), 4 * kMiB},
                                  {At(1 * kMiB, 4 * kMiB), 0}});
  EXPECT_EQ(plan.bytes, 5 * kMiB + 4096);
  ASSERT_EQ(plan.copies.size(), 2u);
  EXPECT_EQ(Off(plan.copies[0].bytes), 1 * kMiB);
  EXPECT_EQ(plan.copies[0].bytes.bytes, 5 * kMiB);
  EXPECT_EQ(plan.copies[0].offset, 0u);
  EXPECT_EQ(Off(plan.copies[1].bytes), 9 * kMiB);
  // [1M, 6M): page [2M, 4M) and [4M, 6M) wholly written; [0, 2M) shared.
  ASSERT_EQ(plan.repopulate.size(), 1u);
  EXPECT_EQ(Off(plan.repopulate[0]), 2 * kMiB);
  EXPECT_EQ(plan.repopulate[0].bytes, 4 * kMiB);
  ASSERT_EQ(plan.prefetch.size(), 2u);
  EXPECT_EQ(Off(plan.prefetch[0]), 0u);
  EXPECT_EQ(plan.prefetch[0].bytes, kPageSize);
  EXPECT_EQ(Off(plan.prefetch[1]), 8 * kMiB);
  EXPECT_EQ(plan.prefetch[1].bytes, kPageSize);
}

TEST(PlanRestoreTest, PartsAdjacentOnTheDeviceButNotInTheStagingAreTwoCopies) {
  RestorePlan plan = PlanRestore({{At(0, 2 * kMiB), 0}, {At(2 * kMiB, 2 * kMiB), 8 * kMiB}});
  ASSERT_EQ(plan.copies.size(), 2u);
  ASSERT_EQ(plan.repopulate.size(), 1u);  // the pages are one run all the same
  EXPECT_EQ(plan.repopulate[0].bytes, 4 * kMiB);
  EXPECT_TRUE(plan.prefetch.empty());
}

TEST(PlanRestoreTest, APageTwoSeparatePartsShareIsPrefetchedOnce) {
  // [1M, 1M+4K) and [1M+8K, 1M+12K): a free gap between them, one page.
  RestorePlan plan = PlanRestore({{At(kMiB, 4096), 0}, {At(kMiB + 8192, 4096), 4096}});
  EXPECT_TRUE(plan.repopulate.empty());
  ASSERT_EQ(plan.prefetch.size(), 1u);
  EXPECT_EQ(Off(plan.prefetch[0]), 0u);
  EXPECT_EQ(plan.prefetch[0].bytes, kPageSize);
  EXPECT_EQ(plan.copies.size(), 2u);
}

TEST(OverlapsAnyTest, FindsTheRangeThatStartsBelowTheEnd) {
  const std::vector<Range> sorted = {At(2 * kMiB, 2 * kMiB), At(8 * kMiB, 2 * kMiB)};
  auto hit = [&](std::size_t lo, std::size_t hi) {
    return OverlapsAny(sorted, kBase + lo, kBase + hi);
  };
  EXPECT_FALSE(hit(0, 2 * kMiB));           // ends where the first begins
  EXPECT_TRUE(hit(3 * kMiB, 9 * kMiB));     // spans both
  EXPECT_TRUE(hit(4 * kMiB - 1, 4 * kMiB));  // the first's last byte
  EXPECT_FALSE(hit(4 * kMiB, 8 * kMiB));    // the gap
  EXPECT_TRUE(hit(9 * kMiB, 20 * kMiB));
  EXPECT_FALSE(hit(10 * kMiB, 20 * kMiB));
  EXPECT_FALSE(OverlapsAny({}, kBase, kBase + 1));
}

}  // namespace
}  // namespace cma
