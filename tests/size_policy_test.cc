#include "policy/size_policy.h"
#include "policy/release_policy.h"

#include "gtest/gtest.h"

namespace cma {
namespace {

TEST(SizePolicyTest, RoundsTo512) {
  AllocatorConfig c;
  EXPECT_EQ(RoundRequest(1, c), 512u);
  EXPECT_EQ(RoundRequest(512, c), 512u);
  EXPECT_EQ(RoundRequest(513, c), 1024u);
  EXPECT_EQ(RoundRequest(18816, c), 18944u);
}

TEST(SizePolicyTest, PowerOfTwoDivisionsAsPyTorchRounds) {
  AllocatorConfig c;
  c.roundup_power2_divisions = RoundupDivisions::Uniform(4);
  // 5 MiB + 1 lies in [4 MiB, 8 MiB): steps of 1 MiB.
  EXPECT_EQ(RoundRequest((5u << 20) + 1, c), 6u << 20);
  EXPECT_EQ(RoundRequest(4u << 20, c), 4u << 20);
  // PyTorch's test_allocator_settings: 84 MiB with 4 divisions is 96 MiB.
  EXPECT_EQ(RoundRequest(84u << 20, c), 96u << 20);
  // Below the small pool's top too, above 512 x 4 bytes: 600 KiB + 1 in
  // [512 KiB, 1 MiB) goes up in steps of 128 KiB.
  EXPECT_EQ(RoundRequest((600u << 10) + 1, c), 640u << 10);
  // Up to 512 x 4 bytes: 512-byte rounding.
  EXPECT_EQ(RoundRequest(1500, c), 1536u);
  EXPECT_EQ(RoundRequest(2048, c), 2048u);
  EXPECT_EQ(RoundRequest(2049, c), 2560u);  // floor 2048, steps of 512
}

TEST(SizePolicyTest, PerIntervalDivisionsAsPyTorchRounds) {
  AllocatorConfig c;
  auto d = RoundupDivisions::Parse("[64:8,128:2,256:2,512:2,1024:1,>:1]");
  ASSERT_TRUE(d.ok()) << d.status();
  c.roundup_power2_divisions = *d;
  // PyTorch's test_allocator_settings: 84 MiB in [64, 128) MiB with 8:
  // steps of 8 MiB.
  EXPECT_EQ(RoundRequest(84u << 20, c), 88u << 20);
  // 400 MiB in [256, 512) MiB with 2: steps of 128 MiB.
  EXPECT_EQ(RoundRequest(400u << 20, c), 512u << 20);
  // The first key's count covers every interval below it.
  EXPECT_EQ(RoundRequest((5u << 20) + 1, c), (5u << 20) + (512u << 10));
  // 1024 and above: 1, plain rounding.
  EXPECT_EQ(RoundRequest((1500u << 20) + 1, c), (1500u << 20) + 512);
}

TEST(SizePolicyTest, PoolBoundaryIsOneMiB) {
  EXPECT_EQ(PoolFor(1u << 20), PoolKind::kSmall);
  EXPECT_EQ(PoolFor((1u << 20) + 512), PoolKind::kLarge);
}

TEST(SizePolicyTest, SegmentSizes) {
  EXPECT_EQ(SegmentSizeFor(512), kSmallSegment);
  EXPECT_EQ(SegmentSizeFor(1u << 20), kSmallSegment);
  EXPECT_EQ(SegmentSizeFor(2u << 20), kLargeSegment);
  EXPECT_EQ(SegmentSizeFor(10u << 20), 10u << 20);
  EXPECT_EQ(SegmentSizeFor((10u << 20) + 512), 12u << 20);
}

TEST(SizePolicyTest, SplitRules) {
  AllocatorConfig c;
  c.segments = SegmentMode::kClassic;
  EXPECT_TRUE(ShouldSplit(kSmallSegment, 512, PoolKind::kSmall, c));
  EXPECT_FALSE(ShouldSplit(1024, 1024, PoolKind::kSmall, c));
  EXPECT_TRUE(ShouldSplit(kLargeSegment, 2u << 20, PoolKind::kLarge, c));
  // Large remainders of 1 MiB or less are not worth a block.
  EXPECT_FALSE(ShouldSplit((3u << 20), 2u << 20, PoolKind::kLarge, c));
}

TEST(SizePolicyTest, MaxSplitSizeStopsSplittingAndLimitsWaste) {
  AllocatorConfig c;
  c.segments = SegmentMode::kClassic;
  c.max_split_size = 64u << 20;
  EXPECT_FALSE(ShouldSplit(128u << 20, 64u << 20, PoolKind::kLarge, c));
  // A small request may not take an oversize block.
  EXPECT_FALSE(CanServe(100u << 20, 2u << 20, c));
  // An oversize request may take an oversize block that wastes < 20 MiB.
  EXPECT_TRUE(CanServe(80u << 20, 70u << 20, c));
  EXPECT_FALSE(CanServe(100u << 20, 70u << 20, c));
}

TEST(SizePolicyTest, ArenaAlwaysSplitsAndIgnoresMaxSplitSize) {
  AllocatorConfig c;  // arena by default
  c.max_split_size = 32u << 20;
  EXPECT_TRUE(ShouldSplit(3u << 20, 2u << 20, PoolKind::kLarge, c));
  EXPECT_TRUE(ShouldSplit(128u << 20, 64u << 20, PoolKind::kLarge, c));
  EXPECT_FALSE(ShouldSplit(4096, 4096, PoolKind::kLarge, c));
  EXPECT_TRUE(CanServe(1u << 30, 2u << 20, c));
  EXPECT_FALSE(CanServe(1u << 20, 2u << 20, c));
}

TEST(ReleasePolicyTest, ArenaKeepsPopulatedPagesNearThePeakInUse) {
  AllocatorConfig strict;
  strict.idle_page_slack = 0;
  // populated 10 (4 idle), 3 new, 9 in use after, peak 9: 13 > 9 -> 4, capped by idle.
  EXPECT_EQ(IdlePagesToDiscard(strict, 10, 4, 3, 9, 9, 100), 4u);
  EXPECT_EQ(IdlePagesToDiscard(strict, 10, 4, 3, 9, 12, 100), 1u);  // an earlier peak of 12
  EXPECT_EQ(IdlePagesToDiscard(strict, 10, 0, 3, 13, 13, 100), 0u);
  EXPECT_EQ(IdlePagesToDiscard(strict, 10, 6, 5, 9, 30, 12), 3u);  // the budget asks
  AllocatorConfig slack;
  slack.idle_page_slack = 0.02;  // 2% of the peak, at least 4 pages
  EXPECT_EQ(IdlePagesToDiscard(slack, 10, 4, 3, 9, 9, 100), 0u);  // 13 <= 9 + 4
  EXPECT_EQ(IdlePagesToDiscard(slack, 1000, 100, 50, 950, 950, 5000), 81u);  // 1050 - 969
  AllocatorConfig off;  // the default: only the budget
  EXPECT_EQ(IdlePagesToDiscard(off, 1000, 100, 50, 950, 950, 5000), 0u);
  EXPECT_EQ(IdlePagesToDiscard(off, 1000, 100, 50, 950, 950, 1020), 30u);
  EXPECT_EQ(IdlePagesToDiscard(off, 1000, 10, 50, 950, 950, 1020), 10u);
}

TEST(ReleasePolicyTest, GarbageCollectionThresholdDiscardsDownToItsMark) {
  AllocatorConfig gc;
  gc.garbage_collection_threshold = 0.5;
  // 12 populated (all idle), 12 new, budget 32: the mark is 16, so 8 go.
  EXPECT_EQ(IdlePagesToDiscard(gc, 12, 12, 12, 12, 12, 32), 8u);
  EXPECT_EQ(IdlePagesToDiscard(gc, 4, 4, 12, 12, 12, 32), 0u);   // 16: at the mark
  EXPECT_EQ(IdlePagesToDiscard(gc, 12, 3, 12, 12, 12, 32), 3u);  // capped by the idle pages
}

TEST(SizePolicyTest, CanServeNeedsEnoughBytes) {
  AllocatorConfig c;
  EXPECT_FALSE(CanServe(1024, 1536, c));
  EXPECT_TRUE(CanServe(1536, 1536, c));
}

}  // namespace
}  // namespace cma

namespace cma {
namespace {

TEST(ReleasePolicyTest, ReleasesOnlyAboveHighWaterMark) {
  AllocatorConfig c;
  EXPECT_EQ(ReleaseBeforeGrowth(c, 100, 200, 150, 1000), 0u);  // off by default
  c.release_before_peak = true;
  EXPECT_EQ(ReleaseBeforeGrowth(c, 100, 200, 50, 1000), 0u);   // stays under the mark
  EXPECT_EQ(ReleaseBeforeGrowth(c, 100, 200, 100, 1000), 0u);  // reaches it exactly
  EXPECT_EQ(ReleaseBeforeGrowth(c, 100, 200, 150, 1000), 150u);
  c.release_before_peak = false;
  EXPECT_EQ(ReleaseBeforeGrowth(c, 100, 200, 150, 1000), 0u);
}

TEST(ReleasePolicyTest, GarbageCollectionThresholdCapsGrowth) {
  AllocatorConfig c;
  c.release_before_peak = false;
  c.garbage_collection_threshold = 0.5;
  EXPECT_EQ(ReleaseBeforeGrowth(c, 400, 900, 50, 1000), 0u);    // 450 <= 500
  EXPECT_EQ(ReleaseBeforeGrowth(c, 480, 900, 100, 1000), 80u);  // 580 - 500
}

TEST(ReleasePolicyTest, ReleaseThresholdAfterFree) {
  AllocatorConfig c;
  EXPECT_EQ(ReleaseAfterFree(c, 1000, 0), 0u);  // no threshold: keep everything
  c.release_threshold = 300;
  EXPECT_EQ(ReleaseAfterFree(c, 1000, 600), 100u);
  EXPECT_EQ(ReleaseAfterFree(c, 1000, 800), 0u);
}

}  // namespace
}  // namespace cma
