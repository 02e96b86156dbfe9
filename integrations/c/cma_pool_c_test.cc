// The C ABI's pool queries and checkpoints on the host backend: use counts,
// a pool's empty_cache, checkpoint/restore with its callbacks, the
// accumulated-stat reset and the pool in the snapshot.
#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integrations/c/capi_test_util.h"
#include "integrations/c/cma_c.h"
#include "nlohmann/json.hpp"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using cma_test::Json;
using PoolCApiTest = cma_test::HostCApiTest;

struct Seen {
  std::vector<std::pair<void*, size_t>> freed, created;
  bool stats_inside = false;  // cma answered from inside a callback
};

void OnFreed(void* ctx, void* p, size_t n) { static_cast<Seen*>(ctx)->freed.push_back({p, n}); }

void OnCreated(void* ctx, void* p, size_t n) {
  auto* seen = static_cast<Seen*>(ctx);
  seen->created.push_back({p, n});
  // The allocator's locks are released: calling back into cma is fine.
  char* stats = cma_stats_json(0);
  seen->stats_inside = stats != nullptr;
  cma_string_free(stats);
}

// Allocations made while pool (7, 0) of device 0 is being allocated to.
std::vector<void*> InPool(std::initializer_list<size_t> sizes) {
  EXPECT_EQ(cma_pool_begin(0, 7, 0, nullptr, nullptr, nullptr), 0) << cma_last_error();
  std::vector<void*> out;
  for (size_t n : sizes) out.push_back(cma_malloc(n, 0, nullptr));
  EXPECT_EQ(cma_pool_end(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
  return out;
}

int released_contexts = 0;
void CountRelease(void*) { ++released_contexts; }
int AcceptAll(void*, void*) { return 1; }

// Unknown flags begin nothing and give the caller's context back; the known
// one begins a context as cma_pool_begin does.
TEST_F(PoolCApiTest, BeginFlags) {
  released_contexts = 0;
  EXPECT_EQ(cma_pool_begin_flags(0, 7, 0, nullptr, nullptr, &CountRelease, 0xd), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("unknown flags 0xc"));
  EXPECT_EQ(released_contexts, 1);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), -1) << "a refused begin made the pool";
  ASSERT_EQ(cma_pool_begin_flags(0, 7, 0, &AcceptAll, nullptr, &CountRelease,
                                 CMA_POOL_REUSE_AFTER_JOIN),
            0)
      << cma_last_error();
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 1);
  EXPECT_EQ(cma_allocating_to_pool(0), 1);
  EXPECT_EQ(cma_allocating_to_pool(99), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("device 99 does not exist"));
  void* p = cma_malloc(512, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(released_contexts, 1) << "the filter's context went while the filter is in use";
  EXPECT_EQ(cma_pool_end(0, 7, 0), 0);
  EXPECT_EQ(released_contexts, 2);
  EXPECT_EQ(cma_allocating_to_pool(0), 0);
  EXPECT_EQ(cma_free(p), 0);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
}

// What a release_ctx did from inside its call.
struct Releaser {
  void* to_free = nullptr;
  int calls = 0;
  int freed = -2;
  int use_count = -2;
  int allocating = -2;
  void* fresh = nullptr;
};

void FreeOnRelease(void* ctx) {
  auto* r = static_cast<Releaser*>(ctx);
  ++r->calls;
  r->freed = cma_free(r->to_free);
}

void CallCmaOnRelease(void* ctx) {
  auto* r = static_cast<Releaser*>(ctx);
  ++r->calls;
  r->use_count = cma_pool_use_count(0, 7, 0);
  r->allocating = cma_allocating_to_pool(0);
  r->fresh = cma_malloc(4096, 0, nullptr);
}

// release_ctx runs once cma's locks are released, so it may free the pool's
// allocations (it ran under the device lock: Abseil's deadlock detection
// aborted the process, and without it the call hung).
TEST_F(PoolCApiTest, ReleaseCtxMayCallCmaFree) {
  Releaser r;
  ASSERT_EQ(cma_pool_begin(0, 7, 0, &AcceptAll, &r, &FreeOnRelease), 0) << cma_last_error();
  r.to_free = cma_malloc(1000, 0, nullptr);
  ASSERT_NE(r.to_free, nullptr);
  EXPECT_EQ(cma_pool_end(0, 7, 0), 0) << cma_last_error();
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.freed, 0) << cma_last_error();
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 1);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 0);  // released and empty: its segment drains
  EXPECT_EQ(cma_empty_cache(), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), -1);  // gone with it
}

// Without a filter, the context is still released only at the end (it was
// released at once, inside cma_pool_begin), and from there any cma call works.
TEST_F(PoolCApiTest, ReleaseCtxWithoutFilterRunsAtTheEndAndMayCallCma) {
  Releaser r;
  ASSERT_EQ(cma_pool_begin(0, 7, 0, nullptr, &r, &CallCmaOnRelease), 0) << cma_last_error();
  EXPECT_EQ(r.calls, 0) << "the context was released while it is open";
  void* p = cma_malloc(1000, 0, nullptr);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(r.calls, 0);
  EXPECT_EQ(cma_pool_end(0, 7, 0), 0) << cma_last_error();
  EXPECT_EQ(r.calls, 1);
  EXPECT_EQ(r.use_count, 1);
  EXPECT_EQ(r.allocating, 0);  // the context had ended
  ASSERT_NE(r.fresh, nullptr) << cma_last_error();
  void* const live[] = {p};
  EXPECT_EQ(cma_pool_check_live(0, 7, 0, live, 1), 1) << "fresh went to the ended pool";
  for (void* x : {p, r.fresh}) EXPECT_EQ(cma_free(x), 0);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
}

TEST_F(PoolCApiTest, UseCountsAndBadInput) {
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("does not exist"));
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 1);
  ASSERT_EQ(cma_pool_begin(0, 7, 0, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 2);
  EXPECT_EQ(cma_pool_end(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 2);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 1);
  EXPECT_EQ(cma_pool_use_count(9, 7, 0), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("device"));
  EXPECT_EQ(cma_pool_checkpoint_take(9, 7, 0), nullptr);
  EXPECT_EQ(cma_pool_checkpoint_take(0, 8, 0), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("does not exist"));
  EXPECT_EQ(cma_pool_checkpoint_restore(nullptr, nullptr, nullptr, nullptr), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("null checkpoint"));
  cma_pool_checkpoint_free(nullptr);
  EXPECT_EQ(cma_pool_empty_cache(9, 7, 0), -1);
  EXPECT_EQ(cma_pool_empty_cache(0, 8, 0), 0);  // unknown: nothing to free, as PyTorch
  EXPECT_EQ(cma_reset_accumulated_stats(5), -1);
  EXPECT_EQ(cma_reset_accumulated_stats(-2), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("invalid device -2"));
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), -1);  // released and empty: dissolved
}

// no_split through the C ABI: set, kept by a -1, visible in the snapshot as
// a block that is a segment of its own; bad flags and pools change nothing.
TEST_F(PoolCApiTest, PoolOptionsAreSetKeptAndShownInTheSnapshot) {
  EXPECT_EQ(cma_pool_set_options(0, 7, 0, 1, -1), -1);  // no such pool
  EXPECT_THAT(cma_last_error(), HasSubstr("does not exist"));
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_set_options(0, 7, 0, 2, 0), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("0, 1 or -1"));
  ASSERT_EQ(cma_pool_set_options(0, 7, 0, 1, -1), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_set_options(0, 7, 0, -1, 1), 0);  // no_split stays on
  std::vector<void*> p = InPool({4 << 20, 4 << 20});
  struct Seen {
    std::vector<cma_block_info> blocks;
  } seen;
  ASSERT_EQ(cma_snapshot_visit([](void*, const cma_segment_info*) {},
                               [](void* c, const cma_block_info* b) {
                                 if (b->pool0 == 7) static_cast<Seen*>(c)->blocks.push_back(*b);
                               },
                               &seen),
            0);
  ASSERT_EQ(seen.blocks.size(), 2u);
  for (const cma_block_info& b : seen.blocks) {
    EXPECT_EQ(b.own_segment, 1);
    EXPECT_EQ(b.size, size_t{20} << 20);  // a whole chunk, as PyTorch's 20 MiB segment
  }
  for (void* x : p) EXPECT_EQ(cma_free(x), 0);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
}

TEST_F(PoolCApiTest, CheckpointRestoreReportsFreedThenCreated) {
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0);
  std::vector<void*> p = InPool({3 << 20, 1000});
  cma_pool_checkpoint* cp = cma_pool_checkpoint_take(0, 7, 0);
  ASSERT_NE(cp, nullptr) << cma_last_error();
  ASSERT_EQ(cma_free(p[0]), 0);
  std::vector<void*> q = InPool({5 << 20});
  Seen seen;
  ASSERT_EQ(cma_pool_checkpoint_restore(cp, &OnFreed, &OnCreated, &seen), 0) << cma_last_error();
  std::sort(seen.freed.begin(), seen.freed.end());
  std::vector<std::pair<void*, size_t>> want_freed = {{p[1], 1000}, {q[0], 5 << 20}};
  std::sort(want_freed.begin(), want_freed.end());
  EXPECT_EQ(seen.freed, want_freed);
  std::vector<std::pair<void*, size_t>> want_created = {{p[0], 3 << 20}, {p[1], 1000}};
  std::sort(want_created.begin(), want_created.end());
  EXPECT_EQ(seen.created, want_created);  // by address
  EXPECT_TRUE(seen.stats_inside);
  void* const live[] = {p[0], p[1]};
  EXPECT_EQ(cma_pool_check_live(0, 7, 0, live, 2), 1);
  // The snapshot names the pool of each block.
  bool found = false;
  for (const auto& seg : Json(cma_snapshot_json())) {
    for (const auto& b : seg["blocks"]) {
      if (b["address"] == reinterpret_cast<std::uintptr_t>(p[0])) {
        found = true;
        EXPECT_EQ(b["pool"], nlohmann::json::array({7, 0}));
      }
    }
  }
  EXPECT_TRUE(found);
  // Restoring the same state again: everything stays in place, and no
  // callback is required.
  ASSERT_EQ(cma_pool_checkpoint_restore(cp, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(cma_pool_check_live(0, 7, 0, live, 2), 1);
  // A context open on the device: refused, nothing reported.
  ASSERT_EQ(cma_pool_begin(0, 8, 0, nullptr, nullptr, nullptr), 0);
  Seen none;
  EXPECT_EQ(cma_pool_checkpoint_restore(cp, &OnFreed, &OnCreated, &none), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("being allocated to"));
  EXPECT_EQ(cma_pool_empty_cache(0, 7, 0), -1);
  EXPECT_TRUE(none.freed.empty() && none.created.empty());
  EXPECT_EQ(cma_pool_end(0, 8, 0), 0);
  EXPECT_EQ(cma_pool_release(0, 8, 0), 0);
  cma_pool_checkpoint_free(cp);
  for (void* x : p) EXPECT_EQ(cma_free(x), 0);
  EXPECT_EQ(cma_pool_release(0, 7, 0), 0);
}

TEST_F(PoolCApiTest, EmptyCacheOfAReleasedPoolAndAccumulatedStatReset) {
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0);
  std::vector<void*> p = InPool({64 << 20, 512});
  ASSERT_EQ(cma_free(p[0]), 0);
  const auto reserved = [] {
    return Json(cma_stats_json(0))["reserved_bytes.all.current"].get<long long>();
  };
  const long long before = reserved();
  EXPECT_EQ(cma_pool_empty_cache(0, 7, 0), 0);
  EXPECT_EQ(reserved(), before);  // referenced: kept
  ASSERT_EQ(cma_pool_release(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 0);  // p[1] keeps it
  EXPECT_EQ(cma_pool_empty_cache(0, 7, 0), 0);
  EXPECT_LE(reserved(), before - (62LL << 20));
  auto stats = Json(cma_stats_json(-1));
  ASSERT_GT(stats["allocation.all.allocated"].get<long long>(), 0);
  ASSERT_GT(stats["num_device_alloc"].get<long long>(), 0);
  ASSERT_EQ(cma_reset_accumulated_stats(-1), 0) << cma_last_error();
  stats = Json(cma_stats_json(-1));
  EXPECT_EQ(stats["allocation.all.allocated"], 0);
  EXPECT_EQ(stats["allocation.all.freed"], 0);
  EXPECT_EQ(stats["allocation.all.current"], 1);
  EXPECT_EQ(stats["num_device_alloc"], 0);
  EXPECT_EQ(stats["num_device_free"], 0);
  EXPECT_EQ(cma_free(p[1]), 0);
  EXPECT_EQ(Json(cma_stats_json(0))["allocation.all.freed"], 1);
}

}  // namespace

namespace {

// PyTorch's allocator class treats this one failure of cma_empty_cache as
// "nothing released" (torch.cuda.graph calls empty_cache): its code is the
// contract, so it is pinned here.
TEST_F(PoolCApiTest, EmptyCacheInsideAPoolContextFailsWithFailedPrecondition) {
  ASSERT_EQ(cma_pool_create_or_incref(0, 9, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_begin(0, 9, 0, nullptr, nullptr, nullptr), 0) << cma_last_error();
  EXPECT_EQ(cma_empty_cache(), -1);
  EXPECT_EQ(cma_last_error_code(), 9);  // absl::StatusCode::kFailedPrecondition
  ASSERT_EQ(cma_pool_end(0, 9, 0), 0);
  EXPECT_EQ(cma_empty_cache(), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_release(0, 9, 0), 0);
}

// A context begun with CMA_POOL_NOT_A_CAPTURE (PyTorch's use_mem_pool)
// routes without quieting cma: empty_cache works inside it, and the pool's
// idle pages go back with the shared cache's while its allocations stay.
TEST_F(PoolCApiTest, ANotACaptureContextLeavesCmaActive) {
  ASSERT_EQ(cma_pool_create_or_incref(0, 9, 0), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_begin_flags(0, 9, 0, nullptr, nullptr, nullptr, CMA_POOL_NOT_A_CAPTURE), 0)
      << cma_last_error();
  EXPECT_EQ(cma_allocating_to_pool(0), 0);
  const size_t big = size_t{64} << 20;
  void* kept = cma_malloc(big, 0, nullptr);
  void* dropped = cma_malloc(big, 0, nullptr);
  ASSERT_NE(kept, nullptr);
  ASSERT_NE(dropped, nullptr);
  auto reserved = [] {
    return Json(cma_stats_json(0))["reserved_bytes.all.current"].get<long long>();
  };
  const long long both = reserved();
  ASSERT_EQ(cma_free(dropped), 0) << cma_last_error();
  EXPECT_EQ(cma_empty_cache(), 0) << cma_last_error();
  EXPECT_LE(reserved(), both - static_cast<long long>(big) + (4 << 20))
      << "the pool's idle pages stayed populated";
  ASSERT_EQ(cma_pool_end(0, 9, 0), 0);
  ASSERT_EQ(cma_free(kept), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_release(0, 9, 0), 0);
  ASSERT_EQ(cma_pool_release(0, 9, 0), 0);
  EXPECT_EQ(cma_empty_cache(), 0) << cma_last_error();
  EXPECT_EQ(reserved(), 0);
  EXPECT_EQ(cma_pool_use_count(0, 9, 0), -1) << "a released, empty pool is forgotten";
}

}  // namespace

namespace {

// A cma_segment_source over malloc: what PyTorch's glue passes for
// MemPool(allocator=...).
struct MallocSource {
  int allocs = 0, frees = 0, released = 0;
  bool out_of_memory = false;
};
void* SourceAlloc(void* ctx, int, size_t bytes, void*) {
  auto* s = static_cast<MallocSource*>(ctx);
  if (s->out_of_memory) return nullptr;
  ++s->allocs;
  return aligned_alloc(4096, bytes);
}
int SourceFree(void* ctx, int, void* p, size_t) {
  ++static_cast<MallocSource*>(ctx)->frees;
  free(p);
  return 0;
}
void SourceRelease(void* ctx) { ++static_cast<MallocSource*>(ctx)->released; }

TEST_F(PoolCApiTest, APoolWithAnotherAllocatorIsCachedCountedAndGivenBack) {
  MallocSource src;
  const cma_segment_source source{&SourceAlloc, &SourceFree, &SourceRelease, &src};
  ASSERT_EQ(cma_pool_create_with_source(0, 7, 0, &source), 0) << cma_last_error();
  const long long segments = Json(cma_stats_json(0))["segment.all.current"].get<long long>();
  std::vector<void*> p = InPool({512, 4096, 5 << 20});
  EXPECT_EQ(src.allocs, 2);  // one 2 MiB segment for the small two, one 20 MiB
  EXPECT_EQ(Json(cma_stats_json(0))["segment.all.current"].get<long long>(), segments + 2);
  // cma does not move another allocator's memory.
  EXPECT_EQ(cma_move(p[2], -1, nullptr, 0), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("not managed memory"));
  for (void* q : p) ASSERT_EQ(cma_free(q), 0);
  p = InPool({512});  // from the pool's cache
  EXPECT_EQ(src.allocs, 2);
  ASSERT_EQ(cma_free(p[0]), 0);
  // The MemPool goes (PyTorch's releasePool, then emptyCache of its id).
  ASSERT_EQ(cma_pool_release(0, 7, 0), 0);
  EXPECT_EQ(src.released, 0);  // its segments still hold the source
  ASSERT_EQ(cma_pool_empty_cache(0, 7, 0), 0) << cma_last_error();
  EXPECT_EQ(src.frees, 2);
  EXPECT_EQ(src.released, 1);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), -1);  // gone
}

TEST_F(PoolCApiTest, ARefusedSourceIsReleasedOnceAndChangesNothing) {
  MallocSource src;
  cma_segment_source source{&SourceAlloc, &SourceFree, &SourceRelease, &src};
  EXPECT_EQ(cma_pool_create_with_source(0, 7, 0, nullptr), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("null source"));
  EXPECT_EQ(cma_pool_create_with_source(5, 7, 0, &source), -1);  // no device 5
  EXPECT_EQ(src.released, 1);
  source.free = nullptr;
  EXPECT_EQ(cma_pool_create_with_source(0, 7, 0, &source), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("both alloc and free"));
  EXPECT_EQ(src.released, 2);
  source.free = &SourceFree;
  ASSERT_EQ(cma_pool_create_or_incref(0, 7, 0), 0);
  EXPECT_EQ(cma_pool_create_with_source(0, 7, 0, &source), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("exists already"));
  EXPECT_EQ(src.released, 3);
  EXPECT_EQ(cma_pool_use_count(0, 7, 0), 1);
  ASSERT_EQ(cma_pool_release(0, 7, 0), 0);
  // Out of memory in the source: cma_malloc fails as out of memory.
  src.out_of_memory = true;
  ASSERT_EQ(cma_pool_create_with_source(0, 8, 0, &source), 0) << cma_last_error();
  ASSERT_EQ(cma_pool_begin(0, 8, 0, nullptr, nullptr, nullptr), 0);
  EXPECT_EQ(cma_malloc(4096, 0, nullptr), nullptr);
  EXPECT_EQ(cma_last_error_code(), 8);  // absl::StatusCode::kResourceExhausted
  EXPECT_THAT(cma_last_error(), HasSubstr("own allocator returned no memory"));
  ASSERT_EQ(cma_pool_end(0, 8, 0), 0);
  ASSERT_EQ(cma_pool_release(0, 8, 0), 0);
  ASSERT_EQ(cma_pool_release(0, 8, 0), 0);
  EXPECT_EQ(src.released, 4);
}

TEST_F(PoolCApiTest, ShutdownGivesASourcesSegmentsBackAndReleasesIt) {
  MallocSource src;
  const cma_segment_source source{&SourceAlloc, &SourceFree, &SourceRelease, &src};
  ASSERT_EQ(cma_pool_create_with_source(0, 7, 0, &source), 0) << cma_last_error();
  std::vector<void*> p = InPool({512});
  cma_shutdown();  // with the allocation live
  EXPECT_EQ(src.frees, 1);
  EXPECT_EQ(src.released, 1);
  ASSERT_EQ(cma_init("", "host"), 0) << cma_last_error();  // for TearDown
}

}  // namespace
