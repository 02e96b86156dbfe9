// Random sequences over three streams, two pools of another allocator
// (allocator/segment_source.h) and one of cma's own, in arena and classic
// mode: contexts opened and ended, allocations, frees after record_stream
// with work still queued, MemPools dropped (release, then empty_cache of the
// id, as PyTorch's MemPool does) and made again, empty_cache. After every
// step a model independent of the allocator checks that each allocation
// came from the memory its routing names (its pool's allocator, or cma's),
// that no two live allocations overlap, that no block freed while a stream
// still had work queued on it is handed out before that work completed,
// that contents survive, and the allocator's own invariants. At the end
// every source has had all its memory back and has been destroyed.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"
#include "tests/segment_source_test_util.h"

namespace cma {
namespace {

constexpr std::uint64_t kCmaPool = 7;  // the pool ids: 5 and 6 sourced, 7 cma's

class SourcedPoolRandomTest
    : public MemPoolFixture,
      public ::testing::WithParamInterface<std::tuple<const char*, int>> {
 protected:
  struct Live {
    std::size_t size;
    std::uint64_t pool;  // 0: the shared cache
    std::uint64_t tag;
    std::vector<std::pair<Stream, std::int64_t>> uses;  // stream, its work count at the use
  };
  struct Busy {  // freed while `stream` had work queued: not to be handed out before it ran
    std::uintptr_t lo, hi;
    Stream stream;
    std::int64_t until;  // the stream's enqueued count at the free
  };
  struct Context {
    std::uint64_t pool;
    bool all;
    Stream only;
  };

  void SetUp() override {
    Remake(std::get<0>(GetParam()));
    streams_ = {kDefaultStream, s1_, s2_};
    rng_.seed(static_cast<unsigned>(std::get<1>(GetParam())));
  }

  std::size_t Pick(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }
  std::int64_t Completed(Stream s) { return enqueued_[s] - backend_->PendingWork(s); }

  // The MemPool object of pool `id` exists (holds its reference).
  void MakeMemPool(std::uint64_t id) {
    if (id == kCmaPool) {
      ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, {id, 0}).ok());
    } else {
      if (alloc_->GetPoolUseCount(0, {id, 0}).ok()) return;  // released, still draining
      logs_.push_back(std::make_unique<SourceLog>());
      source_of_[id] = logs_.back().get();
      ASSERT_TRUE(
          alloc_->CreatePoolWithSource(0, {id, 0}, std::make_shared<FakeSource>(source_of_[id]))
              .ok());
    }
    held_[id] = true;
  }
  void DropMemPool(std::uint64_t id) {
    ASSERT_TRUE(alloc_->ReleasePool(0, {id, 0}).ok());
    held_[id] = false;
    absl::Status e = alloc_->EmptyPoolCache(0, {id, 0});
    if (!contexts_.empty()) {
      EXPECT_EQ(e.code(), absl::StatusCode::kFailedPrecondition) << e;
    } else {
      EXPECT_TRUE(e.ok()) << e;
    }
  }
  std::uint64_t Route(Stream s) const {
    for (auto c = contexts_.rbegin(); c != contexts_.rend(); ++c) {
      if (c->all || c->only == s) return c->pool;
    }
    return 0;
  }
  bool InAnySource(const void* p) const {
    for (const auto& log : logs_) {
      if (InSourceMemory(*log, p)) return true;
    }
    return false;
  }

  void Allocate() {
    static constexpr std::size_t kSizes[] = {512, 4096, 1 << 20, 3 << 20, 12 << 20};
    const std::size_t size = kSizes[Pick(5)];
    const Stream s = streams_[Pick(3)];
    const std::uint64_t pool = Route(s);
    absl::StatusOr<void*> p = alloc_->Allocate(size, 0, s);
    ASSERT_TRUE(p.ok()) << p.status();
    const auto a = reinterpret_cast<std::uintptr_t>(*p);
    Log(absl::StrCat("alloc ", size, " on ", s, " (pool ", pool, ") -> ", a));
    if (pool == 5 || pool == 6) {
      ASSERT_TRUE(InSourceMemory(*source_of_[pool], *p, size)) << "pool " << pool;
    } else {
      ASSERT_FALSE(InAnySource(*p)) << "routed to " << pool << " but in a source's memory";
    }
    auto next = live_.lower_bound(a);
    ASSERT_TRUE(next == live_.end() || next->first >= a + size) << "overlaps a live allocation";
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      ASSERT_LE(prev->first + prev->second.size, a) << "overlaps a live allocation";
    }
    for (const Busy& b : busy_) {
      // (The stream that used it is ordered after its own work.)
      if (b.stream != s && a < b.hi && b.lo < a + size) {
        ASSERT_GE(Completed(b.stream), b.until)
            << "reused before its stream's work ran; recent steps:" << Recent();
      }
    }
    const std::uint64_t tag = next_tag_++;
    std::memcpy(*p, &tag, sizeof(tag));
    live_[a] = {size, pool, tag, {}};
  }

  void Free() {
    if (live_.empty()) return;
    auto it = std::next(live_.begin(), static_cast<long>(Pick(live_.size())));
    std::uint64_t tag = 0;
    std::memcpy(&tag, reinterpret_cast<void*>(it->first), sizeof(tag));
    ASSERT_EQ(tag, it->second.tag) << "contents changed";
    ASSERT_TRUE(alloc_->Free(reinterpret_cast<void*>(it->first)).ok());
    Log(absl::StrCat("free ", it->first));
    for (const auto& [s, count] : it->second.uses) {
      if (Completed(s) < count) busy_.push_back({it->first, it->first + it->second.size, s, count});
    }
    live_.erase(it);
  }

  void UseOnAnotherStream() {
    if (live_.empty()) return;
    auto it = std::next(live_.begin(), static_cast<long>(Pick(live_.size())));
    const Stream s = Pick(2) == 0 ? s1_ : s2_;
    ASSERT_TRUE(backend_->EnqueueWork(s).ok());  // a kernel on s reads the block
    ++enqueued_[s];
    ASSERT_TRUE(alloc_->RecordStream(reinterpret_cast<void*>(it->first), s).ok());
    it->second.uses.push_back({s, enqueued_[s]});
    Log(absl::StrCat("use ", it->first, " on ", s, " (work ", enqueued_[s], ")"));
  }

  void Step() {
    switch (Pick(10)) {
      case 0: case 1: case 2: Allocate(); break;
      case 3: case 4: Free(); break;
      case 5: UseOnAnotherStream(); break;
      case 6: {
        const Stream s = Pick(2) == 0 ? s1_ : s2_;
        ASSERT_TRUE(backend_->CompleteWork(s).ok());
        Log(absl::StrCat("complete ", s));
        break;
      }
      case 7: {  // a context (a MemPool's use_mem_pool or a capture)
        if (contexts_.size() >= 2) break;
        const std::uint64_t id = 5 + Pick(3);
        if (!held_[id]) MakeMemPool(id);
        if (!held_[id]) break;
        const bool all = Pick(2) == 0;
        const Stream only = streams_[Pick(3)];
        StreamFilter f;
        if (!all) f = Only(only);
        ASSERT_TRUE(alloc_->BeginAllocateToPool(0, {id, 0}, std::move(f)).ok());
        Log(absl::StrCat("begin ", id, all ? " all" : absl::StrCat(" on ", only)));
        contexts_.push_back({id, all, only});
        break;
      }
      case 8: {  // the oldest context ends, and its reference goes, as torch's do
        if (contexts_.empty()) break;
        const std::uint64_t id = contexts_.front().pool;
        contexts_.erase(contexts_.begin());
        ASSERT_TRUE(alloc_->EndAllocateToPool(0, {id, 0}).ok());
        ASSERT_TRUE(alloc_->ReleasePool(0, {id, 0}).ok());
        Log(absl::StrCat("end ", id));
        break;
      }
      default: {  // a MemPool dropped, or the cache emptied
        const std::uint64_t id = 5 + Pick(3);
        if (held_[id] && Pick(2) == 0) {
          DropMemPool(id);
          Log(absl::StrCat("drop ", id));
        } else if (contexts_.empty()) {
          ASSERT_TRUE(alloc_->EmptyCache().ok());
          Log("empty_cache");
        }
      }
    }
  }

  // The last steps, for a failure's message.
  void Log(std::string line) {
    log_.push_back(std::move(line));
    if (log_.size() > 40) log_.erase(log_.begin());
  }
  std::string Recent() const {
    std::string out;
    for (const std::string& l : log_) absl::StrAppend(&out, "\n  ", l);
    return out;
  }

  std::vector<std::string> log_;
  std::vector<Stream> streams_;
  std::mt19937 rng_;
  std::vector<std::unique_ptr<SourceLog>> logs_;
  std::map<std::uint64_t, SourceLog*> source_of_;
  std::map<std::uint64_t, bool> held_;
  std::map<std::uintptr_t, Live> live_;
  std::vector<Busy> busy_;
  std::vector<Context> contexts_;
  std::map<Stream, std::int64_t> enqueued_;
  std::uint64_t next_tag_ = 1;
};

TEST_P(SourcedPoolRandomTest, RoutingReuseAndContentsHoldAndEverySourceGetsItsMemoryBack) {
  for (int step = 0; step < 600; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    ASSERT_NO_FATAL_FAILURE(Step());
    absl::Status inv = alloc_->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
  }
  while (!live_.empty()) ASSERT_NO_FATAL_FAILURE(Free());
  while (!contexts_.empty()) {
    const std::uint64_t id = contexts_.front().pool;
    contexts_.erase(contexts_.begin());
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, {id, 0}).ok());
    ASSERT_TRUE(alloc_->ReleasePool(0, {id, 0}).ok());
  }
  for (std::uint64_t id : {5, 6, 7}) {
    if (held_[id]) DropMemPool(id);
  }
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  for (const auto& log : logs_) {
    EXPECT_TRUE(log->live.empty());
    EXPECT_TRUE(log->destroyed);
    EXPECT_EQ(log->allocs.size(), log->frees.size());
  }
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Seeds, SourcedPoolRandomTest,
    ::testing::Combine(::testing::Values("", "segments:classic"), ::testing::Range(0, 12)),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param)[0] == '\0' ? "Arena" : "Classic", "Seed",
                          std::get<1>(info.param));
    });

// A second workload (from the review): more operations, fewer model checks.
class SourcedPoolWorkloadTest : public MemPoolFixture,
                         public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override { Remake(GetParam()); }
  std::shared_ptr<FakeSource> NewSource() {
    logs_.push_back(std::make_unique<SourceLog>());
    return std::make_shared<FakeSource>(logs_.back().get());
  }
  bool InAnySource(void* p) const {
    for (const auto& l : logs_) {
      if (InSourceMemory(*l, p)) return true;
    }
    return false;
  }
  std::vector<std::unique_ptr<SourceLog>> logs_;
};

// Random operations on sourced pools, plain pools and the shared cache,
// checking the invariants and the sources' books after every step.
TEST_P(SourcedPoolWorkloadTest, RandomWorkloadKeepsInvariantsAndSources) {
  std::mt19937 rng(12345);
  struct Live { void* p; int pool; };  // pool -1: shared
  std::vector<Live> live;
  constexpr int kPools = 4;               // 0..2 sourced, 3 plain
  int refs[kPools] = {0, 0, 0, 0};        // references we hold (creation + revives)
  bool known[kPools] = {false, false, false, false};
  auto id = [](int k) { return MemPoolId{100 + k, 0}; };
  const std::size_t sizes[] = {512, 4096, 700 * 1024, 3 << 20, 9 << 20, 25 << 20};
  for (int step = 0; step < 4000; ++step) {
    SCOPED_TRACE(step);
    const int op = rng() % 15;
    const int k = rng() % kPools;
    switch (op) {
      case 0: {  // create
        if (refs[k] > 0) break;
        absl::Status s = k < 3 ? alloc_->CreatePoolWithSource(0, id(k), NewSource())
                               : alloc_->CreateOrIncrefPool(0, id(k));
        if (s.ok()) { ++refs[k]; known[k] = true; }
        break;
      }
      case 1: {  // a context allocating a few blocks
        if (refs[k] == 0) break;
        ASSERT_TRUE(alloc_->BeginAllocateToPool(0, id(k), Only(s1_)).ok());
        const int n = 1 + rng() % 3;
        for (int i = 0; i < n; ++i) {
          auto p = alloc_->Allocate(sizes[rng() % 6], 0, s1_);
          if (p.ok()) {
            live.push_back({*p, k});
            if (k < 3) EXPECT_TRUE(InAnySource(*p));
            else EXPECT_FALSE(InAnySource(*p));
          }
        }
        // a free inside the context too
        if (!live.empty() && rng() % 2) {
          const std::size_t i = rng() % live.size();
          ASSERT_TRUE(alloc_->Free(live[i].p).ok());
          live.erase(live.begin() + i);
        }
        ASSERT_TRUE(alloc_->EndAllocateToPool(0, id(k)).ok());
        ASSERT_TRUE(alloc_->ReleasePool(0, id(k)).ok());
        break;
      }
      case 2: case 3: {  // free
        if (live.empty()) break;
        const std::size_t i = rng() % live.size();
        if (rng() % 3 == 0) {
          ASSERT_TRUE(alloc_->RecordStream(live[i].p, s2_).ok());
          ASSERT_TRUE(backend_->EnqueueWork(s2_).ok());
        }
        ASSERT_TRUE(alloc_->Free(live[i].p).ok());
        live.erase(live.begin() + i);
        break;
      }
      case 4: {  // release our reference
        if (refs[k] == 0) break;
        ASSERT_TRUE(alloc_->ReleasePool(0, id(k)).ok());
        --refs[k];
        break;
      }
      case 5: ASSERT_TRUE(alloc_->EmptyCache().ok()); break;
      case 6: ASSERT_TRUE(alloc_->EmptyPoolCache(0, id(k)).ok()); break;
      case 7: {  // shared allocation
        const Stream s = rng() % 2 ? s1_ : s2_;
        auto p = alloc_->Allocate(sizes[rng() % 6], 0, s);
        if (p.ok()) live.push_back({*p, -1});
        break;
      }
      case 8: {
        if (refs[k] == 0) break;
        ASSERT_TRUE(alloc_->SetPoolOptions(0, id(k), {.no_split = false,
                                                      .use_on_oom = rng() % 2 == 0}).ok());
        break;
      }
      case 9: {
        ASSERT_TRUE(backend_->CompleteWork(rng() % 2 ? s1_ : s2_).ok());
        break;
      }
      case 10: {  // revive/incref an existing pool by id (as a graph capture naming it)
        if (!known[k] || rng() % 4) break;
        absl::StatusOr<int> uc = alloc_->GetPoolUseCount(0, id(k));
        if (!uc.ok()) break;  // gone
        ASSERT_TRUE(alloc_->CreateOrIncrefPool(0, id(k)).ok());
        ++refs[k];
        break;
      }
      case 12: {  // sleep and wake
        if (rng() % 4) break;
        auto sl = alloc_->Sleep(0, s1_, rng() % 2 ? SleepLevel::kDiscard : SleepLevel::kOffload);
        ASSERT_TRUE(sl.ok()) << sl.status();
        auto w = alloc_->Wake(0, s1_);
        ASSERT_TRUE(w.ok()) << w.status();
        break;
      }
      case 13: {  // checkpoint and restore of a referenced pool
        if (refs[k] == 0) break;
        auto cp = alloc_->TakePoolCheckpoint(0, id(k));
        ASSERT_TRUE(cp.ok()) << cp.status();
        auto r = alloc_->RestorePoolCheckpoint(*cp);
        ASSERT_TRUE(r.ok()) << r.status();
        break;
      }
      case 14: {
        if (rng() % 8) break;
        ASSERT_TRUE(alloc_->ForgetStream(s2_).ok());
        break;
      }
      case 11: {  // budget squeeze and back
        if (rng() % 8) break;
        ASSERT_TRUE(alloc_->SetMemoryFraction(0.05, 0).ok());
        auto p = alloc_->Allocate(40 << 20, 0, s2_);
        if (p.ok()) live.push_back({*p, -1});
        ASSERT_TRUE(alloc_->SetMemoryFraction(1.0, 0).ok());
        break;
      }
    }
    absl::Status inv = alloc_->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << inv;
    // Every source's live memory is a segment of the allocator and vice versa.
    std::size_t sourced_segments = 0;
    for (const SegmentSnapshot& s : alloc_->Snapshot()) {
      if (InAnySource(reinterpret_cast<void*>(s.address))) ++sourced_segments;
    }
    std::size_t live_memory = 0;
    for (const auto& l : logs_) live_memory += l->live.size();
    ASSERT_EQ(sourced_segments, live_memory);
  }
  for (const Live& l : live) ASSERT_TRUE(alloc_->Free(l.p).ok());
  for (int k = 0; k < kPools; ++k) {
    while (refs[k]-- > 0) ASSERT_TRUE(alloc_->ReleasePool(0, id(k)).ok());
  }
  for (Stream s : {s1_, s2_}) ASSERT_TRUE(backend_->CompleteWork(s).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  for (const auto& l : logs_) {
    EXPECT_TRUE(l->live.empty());
    EXPECT_TRUE(l->destroyed);
  }
  for (int k = 0; k < kPools; ++k) EXPECT_FALSE(alloc_->GetPoolUseCount(0, id(k)).ok()) << k;
  EXPECT_EQ(Stats().reserved_bytes[kAllPools].current, 0);
  EXPECT_EQ(backend_->CallCount("FreeManaged"),
            backend_->CallCount("AllocateManaged") + backend_->CallCount("ReserveManaged"));
}

INSTANTIATE_TEST_SUITE_P(Modes, SourcedPoolWorkloadTest, ::testing::Values("", "segments:classic"),
                         [](const auto& info) {
                           return std::string(info.param[0] == '\0' ? "Arena" : "Classic");
                         });

}  // namespace
}  // namespace cma
