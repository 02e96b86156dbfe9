// A randomized differential test of the host pool's safety on the host
// backend, with "kernels" that complete only when told: random CPU-side
// allocations and frees, moves to either device (live or contents-dead) and
// back, record_stream with work queued after it, advice that maps, stream
// completion and empty_cache. After every step the invariants hold, and:
//  * no block is handed out again before every stream that used it has
//    completed the work queued on it up to its free;
//  * every live block keeps the tag written into it (nothing else's free,
//    discard or reuse touched it), unless its owner moved it contents-dead;
//  * nothing leaks at the end.
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "tests/test_util.h"

namespace cma {
namespace {

constexpr int kHost = CachingManagedAllocator::kHostDevice;

struct Live {
  unsigned char* p;
  std::size_t n;
  unsigned char tag;
  bool tag_valid = true;
  std::map<Stream, bool> used;  // streams a kernel used it on
};

class HostPoolRandomTest : public AllocatorTest, public ::testing::WithParamInterface<int> {};

TEST_P(HostPoolRandomTest, NoReuseUnderARunningKernelAndEveryTagKept) {
  Make({.device_count = 2, .device_capacity = std::size_t{1} << 30, .manual_completion = true,
        .host_available = std::size_t{96} << 20, .host_total = std::size_t{96} << 20});
  std::mt19937_64 rng(GetParam());
  const std::vector<std::pair<Stream, int>> streams = {
      {*backend_->CreateStream(0), 0}, {*backend_->CreateStream(0), 0},
      {*backend_->CreateStream(1), 1}};
  std::vector<Live> live;
  // Per address freed: the position each stream that used it had reached
  // when it was freed (work queued up to then must complete before reuse).
  std::map<unsigned char*, std::vector<std::pair<Stream, std::int64_t>>> freed;
  const std::size_t sizes[] = {100, 3000, 70000, 1 << 20, (1 << 20) + 1, 3 << 20, 9 << 20};
  int allocs = 0, ooms = 0;
  for (int step = 0; step < 1500; ++step) {
    const int op = static_cast<int>(rng() % 12);
    const auto& [s, dev] = streams[rng() % streams.size()];
    if (op < 4 || live.empty()) {
      const std::size_t n = sizes[rng() % std::size(sizes)];
      absl::StatusOr<void*> got = alloc_->Allocate(n, kHost);
      if (!got.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(got.status())) << got.status();
        ++ooms;
      } else {
        auto* p = static_cast<unsigned char*>(*got);
        if (auto it = freed.find(p); it != freed.end()) {
          for (const auto& [stream, pos] : it->second) {
            ASSERT_GE(backend_->StreamPosition(stream).second, pos)
                << "step " << step << ": " << static_cast<void*>(p)
                << " handed out again while a kernel that used it may still run";
          }
          freed.erase(it);
        }
        const auto tag = static_cast<unsigned char>(rng());
        std::memset(p, tag, n);
        live.push_back({p, n, tag});
        ++allocs;
      }
    } else if (op < 7) {
      const std::size_t i = rng() % live.size();
      Live& l = live[i];
      if (l.tag_valid) {
        ASSERT_EQ(l.p[0], l.tag) << "step " << step;
        ASSERT_EQ(l.p[l.n - 1], l.tag) << "step " << step;
        ASSERT_EQ(l.p[l.n / 2], l.tag) << "step " << step;
      }
      std::vector<std::pair<Stream, std::int64_t>> positions;
      for (const auto& [stream, used] : l.used) {
        positions.emplace_back(stream, backend_->StreamPosition(stream).first);
      }
      ASSERT_TRUE(alloc_->Free(l.p).ok());
      // Chunks of a slab are never discarded, so the tag of a freed chunk
      // may be read by the next owner: only ordering is checked for reuse.
      freed[l.p] = std::move(positions);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op < 9) {
      Live& l = live[rng() % live.size()];
      const bool to_host = rng() % 3 == 0;
      const bool dead = rng() % 4 == 0;
      absl::Status m = alloc_->Move(l.p, to_host ? Location::Host() : Location::Device(dev), s,
                                    dead);
      ASSERT_TRUE(m.ok()) << m;
      if (dead) l.tag_valid = false;  // its owner said the contents are dead
      ASSERT_TRUE(backend_->EnqueueWork(s).ok());  // a kernel uses it there
      l.used[s] = true;
    } else if (op < 10) {
      Live& l = live[rng() % live.size()];
      ASSERT_TRUE(alloc_->RecordStream(l.p, s).ok());
      ASSERT_TRUE(backend_->EnqueueWork(s).ok());
      l.used[s] = true;
    } else if (op < 11) {
      ASSERT_TRUE(backend_->CompleteWork(s).ok());
      if (rng() % 8 == 0) {
        Live& l = live[rng() % live.size()];
        if (l.n > (1 << 20)) {
          AllocationHints prefer_host;
          prefer_host.preferred_location = Location::Host();
          ASSERT_TRUE(alloc_->SetHints(l.p, prefer_host).ok());
        }
      }
    } else {
      ASSERT_TRUE(alloc_->EmptyCache().ok());
    }
    absl::Status inv = alloc_->CheckInvariants();
    ASSERT_TRUE(inv.ok()) << "step " << step << ": " << inv;
  }
  for (const Live& l : live) {
    if (l.tag_valid) {
      ASSERT_EQ(l.p[0], l.tag);
      ASSERT_EQ(l.p[l.n - 1], l.tag);
    }
    ASSERT_TRUE(alloc_->Free(l.p).ok());
  }
  for (const auto& [stream, dev] : streams) ASSERT_TRUE(backend_->CompleteWork(stream).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ExpectInvariants();
  EXPECT_GT(allocs, 250);
  alloc_.reset();
  for (const auto& [stream, dev] : streams) ASSERT_TRUE(backend_->DestroyStream(stream).ok());
  RecordProperty("ooms", ooms);
}

INSTANTIATE_TEST_SUITE_P(Seeds, HostPoolRandomTest, ::testing::Range(1, 5));

}  // namespace
}  // namespace cma
