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
