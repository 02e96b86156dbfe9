// The C ABI on the host backend: lifecycle, errors through cma_last_error,
// JSON stats and snapshot, moves and advice, the PyTorch entry points.
#include <cmath>
#include "integrations/c/cma_c.h"

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "integrations/c/capi_test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace {

using ::testing::HasSubstr;

using cma_test::Json;
using CApiTest = cma_test::HostCApiTest;

TEST_F(CApiTest, MallocFreeAndStats) {
  void* p = cma_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr) << cma_last_error();
  std::memset(p, 1, 1000);
  auto stats = Json(cma_stats_json(0));
  EXPECT_EQ(stats["allocated_bytes.all.current"], 1024);
  EXPECT_EQ(stats["requested_bytes.all.current"], 1000);
  EXPECT_EQ(stats["num_ooms"], 0);
  EXPECT_EQ(cma_device_of(p), 0);
  EXPECT_EQ(cma_allocation_size(p), 1000u);
  EXPECT_EQ(cma_allocation_size(static_cast<char*>(p) + 8), 0u);
  EXPECT_EQ(cma_free(p), 0);
  EXPECT_EQ(Json(cma_stats_json(-1))["allocation.all.current"], 0);
  EXPECT_STREQ(cma_backend_name(), "host");
  EXPECT_EQ(cma_device_count(), 2);
  int local = 0;  // not cma's: -2, not the host pool's -1
  EXPECT_EQ(cma_device_of(&local), -2);
  EXPECT_THAT(cma_last_error(), HasSubstr("not an allocation"));
}

TEST_F(CApiTest, TakeLivePeakWindows) {
  void* p = cma_malloc(5 << 20, 0, nullptr);  // three 2 MiB pages
  ASSERT_NE(p, nullptr) << cma_last_error();
  ASSERT_EQ(cma_free(p), 0);
  EXPECT_EQ(cma_take_live_peak(0), 6 << 20);
  EXPECT_EQ(cma_take_live_peak(0), 0);  // nothing live since
  EXPECT_EQ(cma_take_live_peak(2), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("device 2"));
}

TEST_F(CApiTest, HostRoutingNeedsOversubscription) {
  void* p = cma_malloc(1000, 0, nullptr);
  EXPECT_EQ(cma_placed_on_host(p), 0);
  EXPECT_EQ(cma_set_host_routing(0, 1), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("oversubscribe:1"));
  int local = 0;
  EXPECT_EQ(cma_placed_on_host(&local), -1);
  EXPECT_EQ(cma_free(p), 0);
}

TEST(CApiOversubscriptionTest, RoutedAllocationsLiveOnTheHost) {
  // The host backend's devices have 8 GiB each; the host's real memory
  // bounds the rest (a 9 GiB total needs 1 GiB of it).
  ASSERT_EQ(cma_init("oversubscribe:1,managed_budget:9G", "host"), 0) << cma_last_error();
  ASSERT_EQ(cma_set_host_routing(0, 1), 0) << cma_last_error();
  void* state = cma_malloc(std::size_t{4} << 20, 0, nullptr);
  ASSERT_EQ(cma_set_host_routing(0, 0), 0);
  void* act = cma_malloc(std::size_t{4} << 20, 0, nullptr);
  EXPECT_EQ(cma_placed_on_host(state), 1);
  EXPECT_EQ(cma_placed_on_host(act), 0);
  EXPECT_EQ(cma_set_host_routing(0, 0), -1) << "not on";
  auto stats = Json(cma_stats_json(0));
  EXPECT_EQ(stats["host_resident_bytes.all.current"], 4 << 20);
  EXPECT_EQ(stats["num_host_placements"], 1);
  EXPECT_EQ(cma_free(state), 0);
  EXPECT_EQ(cma_free(act), 0);
  cma_shutdown();
}

TEST_F(CApiTest, SendAwayAndBringBackInOneBatchEach) {
  const std::size_t n = std::size_t{20} << 20;
  auto* a = static_cast<unsigned char*>(cma_malloc(n, 0, nullptr));
  auto* b = static_cast<unsigned char*>(cma_malloc(n, 0, nullptr));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(cma_synchronize(nullptr), 0);
  a[n / 2] = 7;
  void* both[] = {a, b};
  ASSERT_EQ(cma_send_away(both, 2, nullptr), 0) << cma_last_error();
  auto stats = Json(cma_stats_json(0));
  EXPECT_EQ(stats["away_bytes.all.current"], 32 << 20);
  EXPECT_EQ(stats["sent_away_bytes"], 32 << 20);
  ASSERT_EQ(cma_bring_back(both, 2, nullptr), 0) << cma_last_error();
  ASSERT_EQ(cma_synchronize(nullptr), 0);
  EXPECT_EQ(a[n / 2], 7);
  EXPECT_EQ(Json(cma_stats_json(0))["away_bytes.all.current"], 0);
  int local = 0;
  void* bad[] = {a, &local};
  EXPECT_EQ(cma_send_away(bad, 2, nullptr), -1);
  EXPECT_EQ(cma_last_error_code(), 3);
  EXPECT_THAT(cma_last_error(), HasSubstr("not an allocation of this allocator"));
  EXPECT_EQ(cma_send_away(both, -1, nullptr), -1);
  EXPECT_EQ(cma_bring_back(nullptr, 1, nullptr), -1);
  EXPECT_EQ(Json(cma_stats_json(0))["away_bytes.all.current"], 0);
  EXPECT_EQ(cma_free(a), 0);
  EXPECT_EQ(cma_free(b), 0);
}

TEST(CApiConfigTest, TheConfigInForce) {
  ASSERT_EQ(cma_init("learn_step:1,discard_on_free:1", "host"), 0) << cma_last_error();
  auto c = Json(cma_config_json());
  EXPECT_EQ(c["learn_step"], true);
  EXPECT_EQ(c["oversubscribe"], false);
  EXPECT_THAT(c["config"].get<std::string>(), HasSubstr("learn_step:1"));
  void* p = cma_malloc(std::size_t{8} << 20, 0, nullptr);
  EXPECT_EQ(cma_note_uses(0, &p, 1, nullptr), 0) << cma_last_error();
  EXPECT_EQ(cma_note_uses(0, nullptr, 1, nullptr), -1);
  EXPECT_EQ(cma_note_uses(5, &p, 1, nullptr), -1);
  EXPECT_EQ(cma_mark_iteration(0), 0);
  EXPECT_EQ(cma_free(p), 0);
  cma_shutdown();
}

TEST_F(CApiTest, SleepLevelsAndTheStagingRelease) {
  const std::size_t n = std::size_t{4} << 20;
  auto* w = static_cast<unsigned char*>(cma_malloc(n, 0, nullptr));
  auto* kv = static_cast<unsigned char*>(cma_malloc(n, 0, nullptr));
  ASSERT_NE(w, nullptr);
  ASSERT_NE(kv, nullptr);
  std::memset(w, 0x3c, n);
  ASSERT_EQ(cma_set_disposable(kv, 1), 0);
  EXPECT_EQ(cma_sleep_level(0, nullptr, 3), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("sleep level 3"));
  ASSERT_EQ(cma_sleep(0, nullptr), static_cast<long long>(2 * n));  // level 1
  EXPECT_EQ(Json(cma_stats_json(0))["host_staging_bytes.all.current"], n);
  EXPECT_EQ(cma_release_sleep_staging(0), -1);  // it holds w's contents
  EXPECT_EQ(cma_last_error_code(), 9);
  ASSERT_EQ(cma_wake(0, nullptr), static_cast<long long>(2 * n));
  EXPECT_EQ(w[n - 1], 0x3c);
  EXPECT_EQ(cma_release_sleep_staging(0), static_cast<long long>(n));
  EXPECT_EQ(Json(cma_stats_json(0))["host_staging_bytes.all.current"], 0);
  // Level 2 keeps only what is marked keep.
  ASSERT_EQ(cma_set_keep(w, 1), 0);
  ASSERT_EQ(cma_sleep_level(0, nullptr, 2), static_cast<long long>(2 * n));
  ASSERT_EQ(cma_wake(0, nullptr), static_cast<long long>(2 * n));
  EXPECT_EQ(w[0], 0x3c);
  EXPECT_EQ(cma_set_keep(w + 1, 1), -1);
  EXPECT_EQ(cma_free(w), 0);
  EXPECT_EQ(cma_free(kv), 0);
}

TEST_F(CApiTest, ErrorsReachLastError) {
  EXPECT_EQ(cma_malloc(0, 0, nullptr), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("0 bytes"));
  EXPECT_EQ(cma_malloc(64, 9, nullptr), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("invalid device 9"));
  int local;
  EXPECT_EQ(cma_free(&local), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("foreign pointer"));
  EXPECT_EQ(cma_move(&local, -1, nullptr, 0), -1);
  EXPECT_EQ(cma_move(&local, -5, nullptr, 0), -1);
  EXPECT_EQ(cma_stats_json(7), nullptr);
  EXPECT_EQ(cma_set_memory_fraction(1.5, 0), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("not in [0, 1]"));
  EXPECT_EQ(cma_set_memory_fraction(-0.1, 0), -1);
  EXPECT_EQ(cma_set_memory_fraction(std::nan(""), 0), -1);
  EXPECT_EQ(cma_advise(&local, 1, -3, nullptr, 0), -1);
}

TEST_F(CApiTest, InitTwiceWithOtherArgumentsFails) {
  EXPECT_EQ(cma_init("", "host"), 0);  // same: no-op
  EXPECT_EQ(cma_init("prefetch:none", "host"), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("already initialised"));
  cma_shutdown();
  EXPECT_EQ(cma_init("prefetch:bogus", "host"), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("'prefetch'"));
  EXPECT_EQ(cma_init("", "nonesuch"), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("not compiled into this build"));
  EXPECT_EQ(cma_init("", "host"), 0);
}

TEST_F(CApiTest, HostPoolAllocationsMoveToADeviceAndBack) {
  auto* p = static_cast<unsigned char*>(cma_malloc(3 << 20, -1, nullptr));
  ASSERT_NE(p, nullptr) << cma_last_error();
  std::memset(p, 0x3c, 3 << 20);
  EXPECT_EQ(cma_allocation_size(p), std::size_t{3} << 20);
  EXPECT_EQ(cma_device_of(p), -1);
  EXPECT_EQ(cma_placed_on_host(p), 1);
  ASSERT_EQ(cma_move(p, 0, nullptr, 0), 0) << cma_last_error();
  EXPECT_EQ(cma_placed_on_host(p), 0);
  ASSERT_EQ(cma_move(p, -1, nullptr, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_synchronize(nullptr), 0);
  EXPECT_EQ(p[(3 << 20) - 1], 0x3c);
  auto host = Json(cma_host_stats_json());
  EXPECT_EQ(host["allocated_bytes.current"], 4 << 20);
  EXPECT_EQ(host["requested_bytes.current"], 3 << 20);
  EXPECT_EQ(host["moves"], 2);
  EXPECT_EQ(host["moved_bytes_to_device"], 4 << 20);
  // Host memory is not any device's.
  EXPECT_EQ(Json(cma_stats_json(-1))["allocation.all.current"], 0);
  ASSERT_EQ(cma_free(p), 0);
  EXPECT_EQ(cma_free(p), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("double free of host allocation"));
  EXPECT_EQ(cma_malloc(0, -1, nullptr), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("0 bytes"));
  EXPECT_EQ(cma_malloc(64, -2, nullptr), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("invalid device -2"));
  EXPECT_EQ(Json(cma_host_stats_json())["allocation.current"], 0);
}

TEST_F(CApiTest, MoveAdviseAndSnapshot) {
  void* p = cma_malloc(4 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(cma_move(p, -1, nullptr, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_synchronize(nullptr), 0);
  const int by[] = {1};
  ASSERT_EQ(cma_advise(p, 1, 0, by, 1), 0) << cma_last_error();
  auto snap = Json(cma_snapshot_json());
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0]["segment_type"], "large");
  EXPECT_EQ(snap[0]["blocks"][0]["location"], "host");
  EXPECT_EQ(snap[0]["blocks"][0]["state"], "active_allocated");
  auto stats = Json(cma_stats_json(0));
  EXPECT_EQ(stats["moves"], 1);
  EXPECT_EQ(stats["prefetched_bytes_to_host"], 4 << 20);
  EXPECT_GE(stats["advise_calls"], 2);
  EXPECT_EQ(cma_free(p), 0);
  EXPECT_EQ(cma_empty_cache(), 0);
  EXPECT_EQ(Json(cma_stats_json(0))["reserved_bytes.all.current"], 0);
}

TEST_F(CApiTest, MemoryFractionCapsTheBudget) {
  ASSERT_EQ(cma_set_memory_fraction(0, 0), 0);  // PyTorch's 0: nothing fits
  EXPECT_EQ(cma_malloc(512, 0, nullptr), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("managed budget"));
  ASSERT_EQ(cma_set_memory_fraction(0.001, 0), 0);  // 8 GiB host device -> ~8 MiB
  EXPECT_EQ(cma_malloc(32 << 20, 0, nullptr), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("managed budget"));
}

TEST(CApiEnvironmentTest, FirstUseInitialisesFromTheEnvironment) {
  setenv("CMA_BACKEND", "host", 1);
  setenv("CMA_ALLOC_CONF", "max_split_size_mb:64", 1);
  void* p = cma_malloc(1 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr) << cma_last_error();
  EXPECT_STREQ(cma_backend_name(), "host");
  ASSERT_EQ(cma_record_stream(p, nullptr), 0) << cma_last_error();
  ASSERT_EQ(cma_free(p), 0);
  ASSERT_EQ(cma_set_memory_fraction(0.5, 0), 0);
  ASSERT_EQ(cma_empty_cache(), 0);
  EXPECT_EQ(Json(cma_stats_json(0))["reserved_bytes.all.current"], 0);
  cma_shutdown();
  unsetenv("CMA_BACKEND");
  unsetenv("CMA_ALLOC_CONF");
}

// PyTorch's settings strings: kept when given before the allocator exists,
// applied from the next allocation on after; bad ones refused by key.
TEST(CApiPyTorchSettingsTest, BeforeAndAfterTheAllocatorExists) {
  const auto allocated = [] { return Json(cma_stats_json(0))["allocated_bytes.all.current"]; };
  cma_shutdown();
  ASSERT_EQ(cma_apply_pytorch_settings("expandable_segments:True,roundup_power2_divisions:4"), 0)
      << cma_last_error();
  EXPECT_EQ(cma_apply_pytorch_settings("roundup_power2_divisions:[64:3]"), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("'roundup_power2_divisions'"));
  EXPECT_EQ(cma_apply_pytorch_settings(nullptr), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("null"));
  ASSERT_EQ(cma_init("", "host"), 0) << cma_last_error();
  void* p = cma_malloc(84 << 10, 0, nullptr);
  ASSERT_NE(p, nullptr) << cma_last_error();
  EXPECT_EQ(allocated(), 96 << 10);  // the kept string's 4 divisions
  ASSERT_EQ(cma_free(p), 0);
  ASSERT_EQ(cma_apply_pytorch_settings(""), 0);
  p = cma_malloc(84 << 10, 0, nullptr);
  EXPECT_EQ(allocated(), 84 << 10);
  ASSERT_EQ(cma_free(p), 0);
  EXPECT_EQ(cma_apply_pytorch_settings("garbage_collection_threshold:2"), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("'garbage_collection_threshold'"));
  cma_shutdown();
}

// Private pools through the C ABI: the filter sees each allocation's stream,
// its context is released once the pool context ends, and the pool's blocks
// serve only it.
struct FilterCtx {
  int calls = 0;
  bool released = false;
};

int TakeEveryStream(void* ctx, void*) {
  ++static_cast<FilterCtx*>(ctx)->calls;
  return 1;
}

void ReleaseCtx(void* ctx) { static_cast<FilterCtx*>(ctx)->released = true; }

TEST_F(CApiTest, PoolsRouteAllocationsAndReleaseTheFilterContext) {
  FilterCtx ctx;
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_begin(0, 7, 0, &TakeEveryStream, &ctx, &ReleaseCtx), 0) << cma_last_error();
  void* p = cma_malloc(1 << 20, 0, nullptr);
  ASSERT_NE(p, nullptr) << cma_last_error();
  EXPECT_EQ(ctx.calls, 1);
  void* const live[] = {p};
  EXPECT_EQ(cma_pool_check_live(0, 7, 0, live, 1), 1);
  EXPECT_EQ(cma_pool_check_live(0, 7, 0, nullptr, 0), 0);
  EXPECT_EQ(cma_pool_end(0, 7, 0), 0);
  EXPECT_TRUE(ctx.released);
  EXPECT_EQ(cma_pool_end(0, 7, 0), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("not being allocated to"));
  EXPECT_EQ(cma_free(p), 0);
  void* shared = cma_malloc(1 << 20, 0, nullptr);
  EXPECT_NE(shared, p);  // still the pool's
  EXPECT_EQ(cma_free(shared), 0);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);  // the begin's reference
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);  // the create's: the pool dissolves
  EXPECT_EQ(cma_pool_release(0, 7, 0), -1);
  EXPECT_EQ(cma_pool_check_live(0, 7, 0, nullptr, 0), 1);  // its own segment drains
  EXPECT_EQ(cma_empty_cache(), 0);
  EXPECT_EQ(cma_pool_check_live(0, 7, 0, nullptr, 0), -1);  // gone with it
  // A context on a bad device releases the caller's context at once.
  FilterCtx bad;
  EXPECT_EQ(cma_pool_begin(5, 1, 0, &TakeEveryStream, &bad, &ReleaseCtx), -1);
  EXPECT_TRUE(bad.released);
}

}  // namespace
