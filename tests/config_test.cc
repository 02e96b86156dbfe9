#include "policy/config.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, EmptyGivesDefaults) {
  auto c = ParseAllocatorConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->prefetch, PrefetchPolicy::kOnAlloc);
  EXPECT_EQ(c->managed_budget_fraction, 1.0);
  EXPECT_FALSE(c->discard_on_free);
  EXPECT_FALSE(c->multicast);
  EXPECT_EQ(c->ToString(), "");
}

TEST(ConfigTest, ParsesEveryKey) {
  auto c = ParseAllocatorConfig(
      "max_split_size_mb:256, roundup_power2_divisions:4,garbage_collection_threshold:0.6,"
      "prefetch:none,preferred_location:host,accessed_by:0+1,discard_on_free:1,"
      "managed_budget:0.5,release_threshold:512M,multicast:1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_split_size, std::size_t{256} << 20);
  EXPECT_EQ(c->roundup_power2_divisions, RoundupDivisions::Uniform(4));
  EXPECT_DOUBLE_EQ(c->garbage_collection_threshold, 0.6);
  EXPECT_EQ(c->prefetch, PrefetchPolicy::kNone);
  EXPECT_EQ(c->preferred_location, PreferredLocationPolicy::kHost);
  EXPECT_EQ(c->accessed_by, (std::vector<int>{0, 1}));
  EXPECT_TRUE(c->discard_on_free);
  EXPECT_DOUBLE_EQ(c->managed_budget_fraction, 0.5);
  EXPECT_EQ(c->release_threshold, std::size_t{512} << 20);
  EXPECT_TRUE(c->multicast);
}

TEST(ConfigTest, FractionsRoundTripExactly) {
  // Found by the config fuzzer: six digits turned this into 1, which the
  // parser rejects.
  auto c = ParseAllocatorConfig("garbage_collection_threshold:.99999999990003729,"
                                "idle_page_slack:0.1,managed_budget:0.3");
  ASSERT_TRUE(c.ok()) << c.status();
  auto again = ParseAllocatorConfig(c->ToString());
  ASSERT_TRUE(again.ok()) << again.status() << " from " << c->ToString();
  EXPECT_EQ(again->garbage_collection_threshold, c->garbage_collection_threshold);
  EXPECT_EQ(again->idle_page_slack, 0.1);
  EXPECT_EQ(again->managed_budget_fraction, 0.3);
}

TEST(ConfigTest, RoundTripsThroughToString) {
  const char* text = "max_split_size_mb:64,prefetch:on_move,accessed_by:all,managed_budget:1073741824";
  auto c = ParseAllocatorConfig(text);
  ASSERT_TRUE(c.ok());
  auto again = ParseAllocatorConfig(c->ToString());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToString(), c->ToString());
  EXPECT_EQ(again->managed_budget_bytes, std::size_t{1} << 30);
  EXPECT_TRUE(again->accessed_by_all);
}

TEST(ConfigTest, LearnTransferThreadNeedsLearnStepAndRoundTrips) {
  auto alone = ParseAllocatorConfig("segments:arena,learn_transfer_thread:1");
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(alone.status().message(), HasSubstr("learn_transfer_thread:1 needs learn_step:1"));
  EXPECT_THAT(ParseAllocatorConfig("learn_transfer_thread:2").status().message(),
              HasSubstr("learn_transfer_thread"));
  auto c = ParseAllocatorConfig("segments:arena,learn_step:1,learn_transfer_thread:1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->learn_transfer_thread);
  auto again = ParseAllocatorConfig(c->ToString());
  ASSERT_TRUE(again.ok()) << c->ToString();
  EXPECT_TRUE(again->learn_transfer_thread);
  EXPECT_FALSE(ParseAllocatorConfig("")->learn_transfer_thread);
}

TEST(ConfigTest, SleepStagingMax) {
  EXPECT_EQ(ParseAllocatorConfig("")->sleep_staging_max, std::numeric_limits<std::size_t>::max());
  auto c = ParseAllocatorConfig("sleep_staging_max:6G");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sleep_staging_max, std::size_t{6} << 30);
  auto again = ParseAllocatorConfig(c->ToString());
  ASSERT_TRUE(again.ok()) << c->ToString();
  EXPECT_EQ(again->sleep_staging_max, std::size_t{6} << 30);
  EXPECT_EQ(ParseAllocatorConfig("sleep_staging_max:0")->sleep_staging_max, 0u);
  EXPECT_EQ(ParseAllocatorConfig("sleep_staging_max:0,sleep_staging_max:none")->sleep_staging_max,
            std::numeric_limits<std::size_t>::max());
  EXPECT_EQ(ParseAllocatorConfig("sleep_staging_max:none")->ToString(), "");
}

TEST(ConfigTest, SleepPinThreads) {
  EXPECT_EQ(ParseAllocatorConfig("")->sleep_pin_threads, 8);
  auto c = ParseAllocatorConfig("sleep_pin_threads:1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sleep_pin_threads, 1);
  EXPECT_EQ(c->ToString(), "sleep_pin_threads:1");
  EXPECT_EQ(ParseAllocatorConfig(c->ToString())->sleep_pin_threads, 1);
  for (const char* bad : {"sleep_pin_threads:0", "sleep_pin_threads:65", "sleep_pin_threads:x"}) {
    auto b = ParseAllocatorConfig(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_THAT(b.status().message(), HasSubstr("a count from 1 to 64")) << bad;
  }
}

TEST(ConfigTest, WakeFence) {
  EXPECT_TRUE(ParseAllocatorConfig("")->wake_fence);
  auto c = ParseAllocatorConfig("wake_fence:0");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->wake_fence);
  EXPECT_EQ(c->ToString(), "wake_fence:0");
  EXPECT_FALSE(ParseAllocatorConfig(c->ToString())->wake_fence);
  EXPECT_EQ(ParseAllocatorConfig("wake_fence:1")->ToString(), "");
  auto bad = ParseAllocatorConfig("wake_fence:5");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("wake_fence"));
}

TEST(ConfigTest, PerIntervalRoundupDivisionsAsPyTorchWritesThem) {
  // Among other keys: the commas inside the brackets do not end the item.
  auto c = ParseAllocatorConfig(
      "garbage_collection_threshold:0.5, roundup_power2_divisions:[64:8,128:2,256:2,512:2,"
      "1024:1,>:1], max_split_size_mb:40");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->garbage_collection_threshold, 0.5);
  EXPECT_EQ(c->max_split_size, std::size_t{40} << 20);
  const RoundupDivisions& d = c->roundup_power2_divisions;
  EXPECT_EQ(d.For(1000), 8);              // the first key covers the intervals below it
  EXPECT_EQ(d.For(std::size_t{3} << 20), 8);
  EXPECT_EQ(d.For(std::size_t{84} << 20), 8);   // [64, 128) MiB
  EXPECT_EQ(d.For(std::size_t{200} << 20), 2);  // [128, 256) MiB
  EXPECT_EQ(d.For(std::size_t{600} << 20), 2);  // [512, 1024) MiB
  EXPECT_EQ(d.For(std::size_t{2} << 30), 1);
  EXPECT_EQ(d.For(std::size_t{1} << 45), 1);    // the last interval has no end
  // Back to text and again: the same value.
  auto again = ParseAllocatorConfig(c->ToString());
  ASSERT_TRUE(again.ok()) << again.status() << " " << c->ToString();
  EXPECT_EQ(again->roundup_power2_divisions, d);
  EXPECT_EQ(ParseAllocatorConfig("roundup_power2_divisions:[>:4]")->roundup_power2_divisions,
            RoundupDivisions::Uniform(4));
  EXPECT_EQ(ParseAllocatorConfig("roundup_power2_divisions:4")->ToString(),
            "roundup_power2_divisions:4");
  EXPECT_EQ(ParseAllocatorConfig("roundup_power2_divisions:0")->ToString(), "");
  // As PyTorch reads them: nothing set, and a comma before the ']'.
  EXPECT_EQ(ParseAllocatorConfig("roundup_power2_divisions:[]")->roundup_power2_divisions,
            RoundupDivisions());
  const auto trailing = ParseAllocatorConfig("roundup_power2_divisions:[1:2,]");
  ASSERT_TRUE(trailing.ok()) << trailing.status();
  EXPECT_EQ(trailing->roundup_power2_divisions.For(1000), 2);  // [0, 2 MiB) only
  EXPECT_EQ(trailing->roundup_power2_divisions.For(std::size_t{3} << 20), 0);
}

TEST(ConfigTest, BadRoundupDivisionsNameThePart) {
  for (const char* text : {"roundup_power2_divisions:[64:3]", "roundup_power2_divisions:[48:2]",
                           "roundup_power2_divisions:[64:2", "roundup_power2_divisions:[64]",
                           "roundup_power2_divisions:[x:2]", "roundup_power2_divisions:65536",
                           "roundup_power2_divisions:[64:2,,]"}) {
    auto c = ParseAllocatorConfig(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_THAT(c.status().message(), HasSubstr("'roundup_power2_divisions'")) << text;
    EXPECT_THAT(c.status().message(), HasSubstr("MiB:count")) << text;
  }
}

TEST(ConfigTest, UnknownKeyNamesKeyAndAcceptedKeys) {
  auto c = ParseAllocatorConfig("max_split_size_mb:64,expandable_segments:True");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("unknown key 'expandable_segments'"));
  EXPECT_THAT(c.status().message(), HasSubstr("managed_budget"));
}

TEST(ConfigTest, BadValuesNameKeyAndAcceptedValues) {
  struct Case { const char* text; const char* key; const char* accepted; };
  for (const Case& k : {
           Case{"prefetch:always", "prefetch", "none, on_alloc, on_move"},
           Case{"preferred_location:gpu", "preferred_location", "none, device, host"},
           Case{"discard_on_free:yes", "discard_on_free", "0 or 1"},
           Case{"max_split_size_mb:-3", "max_split_size_mb", "positive number"},
           Case{"roundup_power2_divisions:3", "roundup_power2_divisions", "power of two"},
           Case{"garbage_collection_threshold:1.5", "garbage_collection_threshold", "between 0 and 1"},
           Case{"managed_budget:1.5", "managed_budget", "fraction in (0, 1]"},
           Case{"managed_budget:0", "managed_budget", "fraction in (0, 1]"},
           Case{"release_threshold:lots", "release_threshold", "a size"},
           Case{"accessed_by:0+x", "accessed_by", "device ids"},
           Case{"multicast:2", "multicast", "0 or 1"},
           Case{"sleep_staging_max:all", "sleep_staging_max", "none, or a size"},
       }) {
    auto c = ParseAllocatorConfig(k.text);
    ASSERT_FALSE(c.ok()) << k.text;
    EXPECT_THAT(c.status().message(), HasSubstr(std::string("'") + k.key + "'")) << k.text;
    EXPECT_THAT(c.status().message(), HasSubstr(k.accepted)) << k.text;
  }
}

TEST(ConfigTest, MissingColonIsAnError) {
  auto c = ParseAllocatorConfig("prefetch");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("not key:value"));
}

TEST(ConfigTest, ParseSizeSuffixes) {
  EXPECT_EQ(*ParseSize("512"), 512u);
  EXPECT_EQ(*ParseSize("64K"), 64u << 10);
  EXPECT_EQ(*ParseSize("20m"), 20u << 20);
  EXPECT_EQ(*ParseSize("8G"), std::size_t{8} << 30);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("G").ok());
  EXPECT_FALSE(ParseSize("99999999999999999999G").ok());
}

TEST(ConfigTest, ManagedBudgetAbsoluteSize) {
  auto c = ParseAllocatorConfig("managed_budget:8G");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->managed_budget_bytes, std::size_t{8} << 30);
}

TEST(ConfigTest, LaterKeysOverrideEarlier) {
  auto c = ParseAllocatorConfig("prefetch:none,prefetch:on_move");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->prefetch, PrefetchPolicy::kOnMove);
}

TEST(ConfigTest, FromEnv) {
  setenv("CMA_ALLOC_CONF", "discard_on_free:1", 1);
  auto c = AllocatorConfigFromEnv();
  unsetenv("CMA_ALLOC_CONF");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->discard_on_free);
}

}  // namespace
}  // namespace cma
