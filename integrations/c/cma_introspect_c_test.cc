// cma_stats_pairs and cma_snapshot_visit: what a framework's allocator class
// (PyTorch's c10 CUDAAllocator in cma/torch/_ext/cuda_allocator.cc) reads instead of JSON.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "integrations/c/capi_test_util.h"
#include "integrations/c/cma_c.h"

namespace {

using cma_test::HostCApiTest;
using cma_test::Json;

constexpr size_t kMiB = size_t{1} << 20;

std::map<std::string, long long> Pairs(int device) {
  const long long n = cma_stats_pairs(device, nullptr, 0);
  EXPECT_GT(n, 0) << cma_last_error();
  std::vector<cma_stat_pair> pairs(n > 0 ? n : 0);
  EXPECT_EQ(cma_stats_pairs(device, pairs.data(), pairs.size()), n);
  std::map<std::string, long long> m;
  for (const cma_stat_pair& p : pairs) m[p.key] = p.value;
  return m;
}

TEST_F(HostCApiTest, StatsPairsMatchTheJsonStatistics) {
  void* p = cma_malloc(3 * kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr) << cma_last_error();
  const std::map<std::string, long long> pairs = Pairs(0);
  const nlohmann::json j = Json(cma_stats_json(0));
  EXPECT_EQ(pairs.at("allocated_bytes.all.current"), 3 * static_cast<long long>(kMiB));
  for (const auto& [key, value] : pairs) EXPECT_EQ(j.at(key).get<long long>(), value) << key;
  // A short array gets the first pairs and the full count.
  cma_stat_pair two[2];
  EXPECT_EQ(cma_stats_pairs(0, two, 2), static_cast<long long>(pairs.size()));
  EXPECT_EQ(pairs.at(two[0].key), two[0].value);
  ASSERT_EQ(cma_free(p), 0);
}

TEST_F(HostCApiTest, StatsPairsOfABadDeviceFailNamingIt) {
  EXPECT_EQ(cma_stats_pairs(99, nullptr, 0), -1);
  EXPECT_NE(std::string(cma_last_error()).find("99"), std::string::npos) << cma_last_error();
}

struct Seen {
  std::vector<cma_segment_info> segments;
  std::vector<std::vector<cma_block_info>> blocks;
};

Seen Visit() {
  Seen seen;
  auto on_segment = [](void* c, const cma_segment_info* s) {
    auto* x = static_cast<Seen*>(c);
    x->segments.push_back(*s);
    x->blocks.emplace_back();
  };
  auto on_block = [](void* c, const cma_block_info* b) {
    static_cast<Seen*>(c)->blocks.back().push_back(*b);
  };
  EXPECT_EQ(cma_snapshot_visit(on_segment, on_block, &seen), 0) << cma_last_error();
  return seen;
}

TEST_F(HostCApiTest, SnapshotVisitClipsAnArenaToWhatMemoryHeld) {
  void* a = cma_malloc(3 * kMiB, 0, nullptr);
  void* b = cma_malloc(1000, 0, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(cma_free(a), 0);
  const Seen seen = Visit();
  // One arena serves every size; its address range is far larger than the
  // two pages the blocks reached (the second page shared with b).
  ASSERT_EQ(seen.segments.size(), 1u);
  const cma_segment_info& s = seen.segments[0];
  EXPECT_TRUE(s.is_arena);
  EXPECT_TRUE(s.is_large);
  EXPECT_EQ(s.total_size, 4 * kMiB);
  ASSERT_EQ(seen.blocks[0].size(), s.n_blocks);
  size_t sum = 0;
  for (const cma_block_info& blk : seen.blocks[0]) sum += blk.size;
  EXPECT_EQ(sum, s.total_size);
  ASSERT_EQ(s.n_blocks, 3u);
  const cma_block_info& live = seen.blocks[0][1];
  EXPECT_EQ(live.address, reinterpret_cast<size_t>(a) + 3 * kMiB);
  EXPECT_EQ(live.requested_size, 1000u);
  EXPECT_TRUE(live.allocated);
  EXPECT_TRUE(live.active);
  EXPECT_EQ(live.pool0, 0u);
  EXPECT_EQ(live.pool1, 0u);
  EXPECT_FALSE(seen.blocks[0][0].allocated);
  EXPECT_FALSE(seen.blocks[0][2].active);
  ASSERT_EQ(cma_free(b), 0);
  // Nothing in use, but the pages stay populated (cached, as PyTorch's
  // segments stay until empty_cache): the same range, every block free.
  const Seen cached = Visit();
  ASSERT_EQ(cached.segments.size(), 1u);
  EXPECT_EQ(cached.segments[0].total_size, 4 * kMiB);
  EXPECT_EQ(cached.segments[0].allocated_size, 0u);
  for (const cma_block_info& blk : cached.blocks[0]) EXPECT_FALSE(blk.active);
  // Released pages: nothing worth showing.
  ASSERT_EQ(cma_empty_cache(), 0) << cma_last_error();
  EXPECT_TRUE(Visit().segments.empty());
}

TEST_F(HostCApiTest, SnapshotVisitShowsAFreeBlockUpToItsLastPopulatedPage) {
  // A freed 9 MiB block stays in view up to the end of its last populated
  // page (five whole pages) until empty_cache releases them.
  void* big = cma_malloc(9 * kMiB, 0, nullptr);
  ASSERT_NE(big, nullptr) << cma_last_error();
  ASSERT_EQ(cma_free(big), 0);
  const Seen seen = Visit();
  ASSERT_EQ(seen.segments.size(), 1u);
  EXPECT_EQ(seen.segments[0].total_size, 10 * kMiB);  // 9 MiB rounded to pages
  ASSERT_EQ(cma_empty_cache(), 0) << cma_last_error();
  EXPECT_TRUE(Visit().segments.empty());
}

TEST_F(HostCApiTest, SnapshotVisitNamesAMissingCallback) {
  EXPECT_EQ(cma_snapshot_visit(nullptr, nullptr, nullptr), -1);
  EXPECT_NE(std::string(cma_last_error()).find("callbacks"), std::string::npos);
}

TEST_F(HostCApiTest, SnapshotVisitReportsAPoolsBlocks) {
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_begin(0, 7, 0, nullptr, nullptr, nullptr), 0) << cma_last_error();
  void* p = cma_malloc(kMiB, 0, nullptr);
  ASSERT_NE(p, nullptr) << cma_last_error();
  ASSERT_EQ(cma_pool_end(0, 7, 0), 0);
  bool found = false;
  const Seen seen = Visit();
  for (const auto& blocks : seen.blocks) {
    for (const cma_block_info& b : blocks) {
      if (b.address != reinterpret_cast<size_t>(p)) continue;
      found = true;
      EXPECT_EQ(b.pool0, 7u);
      EXPECT_EQ(b.pool1, 0u);
    }
  }
  EXPECT_TRUE(found);
  ASSERT_EQ(cma_free(p), 0);
  ASSERT_EQ(cma_pool_release(0, 7, 0), 0);
}

// PyTorch's snapshot readers compute each block's address as its segment's
// plus the sizes of the blocks before it, and read one owner pool per
// segment. The visitor's blocks must therefore tile their segment from its
// address; a pool's blocks lie in segments of its own (as PyTorch's pools'
// do), while one arena holds the shared cache's blocks of every size.
TEST_F(HostCApiTest, SnapshotVisitBlocksTileTheirSegmentAndPoolsOwnTheirs) {
  void* shared = cma_malloc(kMiB, 0, nullptr);
  ASSERT_NE(shared, nullptr) << cma_last_error();
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_begin(0, 7, 0, nullptr, nullptr, nullptr), 0) << cma_last_error();
  void* pooled = cma_malloc(kMiB, 0, nullptr);
  ASSERT_NE(pooled, nullptr) << cma_last_error();
  ASSERT_EQ(cma_pool_end(0, 7, 0), 0);
  void* after = cma_malloc(kMiB, 0, nullptr);
  ASSERT_NE(after, nullptr) << cma_last_error();
  const Seen seen = Visit();
  int pool_segments = 0;
  for (size_t i = 0; i < seen.segments.size(); ++i) {
    size_t address = seen.segments[i].address;
    bool pool_seen = false, shared_seen = false;
    for (const cma_block_info& b : seen.blocks[i]) {
      EXPECT_EQ(b.address, address) << "segment " << i;
      address += b.size;
      (b.pool0 == 7 ? pool_seen : shared_seen) = true;
    }
    EXPECT_EQ(address, seen.segments[i].address + seen.segments[i].total_size) << "segment " << i;
    EXPECT_FALSE(pool_seen && shared_seen) << "segment " << i << " mixes pool (7, 0) with the shared cache";
    pool_segments += pool_seen;
  }
  EXPECT_EQ(pool_segments, 1);
  for (void* p : {shared, pooled, after}) ASSERT_EQ(cma_free(p), 0);
  ASSERT_EQ(cma_pool_release(0, 7, 0), 0);
}

}  // namespace

namespace {

// What cma follows now: CMA_ALLOC_CONF's shared keys until PyTorch's settings
// replace them, the string itself kept, and back again when a string leaves
// a key out (what PyTorch's getDeviceStats and snapshot config report).
TEST(CApiLiveSettingsTest, FollowPyTorchsSettingsAndTheLastString) {
  cma_shutdown();
  ASSERT_EQ(cma_init("max_split_size_mb:64,roundup_power2_divisions:2", "host"), 0)
      << cma_last_error();
  cma_live_settings_info s;
  ASSERT_EQ(cma_live_settings(&s), 0) << cma_last_error();
  EXPECT_EQ(s.max_split_size, 64 * kMiB);
  EXPECT_EQ(s.garbage_collection_threshold, 0.0);
  for (size_t d : s.roundup_power2_divisions) EXPECT_EQ(d, 2u);
  EXPECT_EQ(s.is_arena, 1);
  EXPECT_STREQ(s.pytorch_settings, "");

  const char* torch =
      "max_split_size_mb:128,roundup_power2_divisions:[64:8,128:2,256:4,>:1],"
      "garbage_collection_threshold:0.5,expandable_segments:True";
  ASSERT_EQ(cma_apply_pytorch_settings(torch), 0) << cma_last_error();
  ASSERT_EQ(cma_live_settings(&s), 0) << cma_last_error();
  EXPECT_EQ(s.max_split_size, 128 * kMiB);
  EXPECT_EQ(s.garbage_collection_threshold, 0.5);
  // Interval i starts at 1 MiB << i; 64's count covers every interval below, and
  // ">" the last named one (256) and above, as in PyTorch.
  EXPECT_EQ(s.roundup_power2_divisions[0], 8u);
  EXPECT_EQ(s.roundup_power2_divisions[6], 8u);
  EXPECT_EQ(s.roundup_power2_divisions[7], 2u);
  EXPECT_EQ(s.roundup_power2_divisions[8], 1u);
  EXPECT_EQ(s.roundup_power2_divisions[15], 1u);
  EXPECT_STREQ(s.pytorch_settings, torch);

  const nlohmann::json c = Json(cma_config_json());
  EXPECT_EQ(c["config"].get<std::string>().find("max_split_size_mb:128"), std::string::npos);
  EXPECT_NE(c["live"]["config"].get<std::string>().find("max_split_size_mb:128"),
            std::string::npos)
      << c.dump();
  EXPECT_EQ(c["live"]["max_split_size"].get<size_t>(), 128 * kMiB);
  EXPECT_EQ(c["live"]["garbage_collection_threshold"].get<double>(), 0.5);
  EXPECT_EQ(c["live"]["roundup_power2_divisions_by_interval"][7], 2);
  EXPECT_EQ(c["live"]["segments"], "arena");
  EXPECT_EQ(c["live"]["pytorch_settings"], torch);

  // A string that leaves the keys out gives CMA_ALLOC_CONF's values back.
  ASSERT_EQ(cma_apply_pytorch_settings("expandable_segments:False"), 0) << cma_last_error();
  ASSERT_EQ(cma_live_settings(&s), 0);
  EXPECT_EQ(s.max_split_size, 64 * kMiB);
  EXPECT_EQ(s.roundup_power2_divisions[7], 2u);
  EXPECT_EQ(s.garbage_collection_threshold, 0.0);
  EXPECT_STREQ(s.pytorch_settings, "expandable_segments:False");
  // A refused string changes nothing, the string included.
  EXPECT_EQ(cma_apply_pytorch_settings("max_split_size_mb:-3"), -1);
  ASSERT_EQ(cma_live_settings(&s), 0);
  EXPECT_EQ(s.max_split_size, 64 * kMiB);
  EXPECT_STREQ(s.pytorch_settings, "expandable_segments:False");
  EXPECT_EQ(cma_live_settings(nullptr), -1);
  cma_shutdown();
  // Unlimited by default; classic segments are not arenas.
  ASSERT_EQ(cma_init("segments:classic", "host"), 0) << cma_last_error();
  ASSERT_EQ(cma_live_settings(&s), 0);
  EXPECT_EQ(s.max_split_size, SIZE_MAX);
  EXPECT_EQ(s.is_arena, 0);
  EXPECT_EQ(Json(cma_config_json())["live"]["segments"], "classic");
  cma_shutdown();
}

// The host pool's live allocations (CPU tensors in managed memory), with
// where their pages are: what the device snapshot does not show.
TEST_F(HostCApiTest, HostSnapshotListsTheHostPoolsLiveAllocations) {
  EXPECT_EQ(Json(cma_host_snapshot_json()).size(), 0u);
  void* small = cma_malloc(100 << 10, -1, nullptr);
  void* big = cma_malloc(3 * kMiB, -1, nullptr);
  void* dev = cma_malloc(kMiB, 0, nullptr);
  ASSERT_TRUE(small != nullptr && big != nullptr && dev != nullptr) << cma_last_error();
  ASSERT_EQ(cma_move(big, 0, nullptr, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_synchronize(nullptr), 0);
  const nlohmann::json h = Json(cma_host_snapshot_json());
  ASSERT_EQ(h.size(), 2u) << h.dump();
  std::map<size_t, nlohmann::json> by_addr;
  for (const auto& b : h) by_addr[b["address"].get<size_t>()] = b;
  ASSERT_EQ(by_addr.count(reinterpret_cast<size_t>(small)), 1u) << h.dump();
  const nlohmann::json& s = by_addr[reinterpret_cast<size_t>(small)];
  const nlohmann::json& b = by_addr[reinterpret_cast<size_t>(big)];
  EXPECT_EQ(s["requested_size"], 100 << 10);
  EXPECT_GE(s["size"].get<size_t>(), size_t{100} << 10);
  EXPECT_EQ(s["state"], "active_allocated");
  EXPECT_EQ(s["location"], "host");
  EXPECT_EQ(b["requested_size"], 3 * kMiB);
  EXPECT_EQ(b["location"], "device 0");
  EXPECT_LT(h[0]["address"].get<size_t>(), h[1]["address"].get<size_t>());  // by address
  // The device's allocation is the device snapshot's, not the host's.
  for (const auto& seg : Json(cma_snapshot_json())) EXPECT_EQ(seg["on_host"], false);
  ASSERT_EQ(cma_free(small), 0);
  ASSERT_EQ(cma_free(big), 0);
  ASSERT_EQ(cma_free(dev), 0);
  ASSERT_EQ(cma_synchronize(nullptr), 0);
  for (const auto& blk : Json(cma_host_snapshot_json())) {
    EXPECT_NE(blk["state"], "active_allocated") << blk.dump();
  }
}

}  // namespace
