// Random captures over four streams, reuse-after-join on: after every
// allocation, an independent model of the capture graph checks that a block
// freed during the capture came back only to a stream whose work already
// follows every use of it (its owner's and each record_stream stream's, as
// they stood at the free). The model is built from the test's own calls,
// not from the backend's graph or the allocator's walk
// (allocator/capture_reuse.h), so a wrong answer in either shows.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

constexpr MemPoolId kPool{11, 0};

// The capture graph as the test built it: each node's dependencies, and
// each stream's frontier (the nodes its next work depends on).
class GraphModel {
 public:
  void Node(Stream s, CaptureNode n) {
    deps_[n] = frontier_[s];
    frontier_[s] = {n};
  }
  void Join(Stream waiter, Stream waited) {
    for (CaptureNode n : frontier_[waited]) frontier_[waiter].insert(n);
  }
  const std::set<CaptureNode>& Frontier(Stream s) { return frontier_[s]; }
  // Every node in `nodes` is `s`'s frontier or an ancestor of it.
  bool Follows(Stream s, const std::set<CaptureNode>& nodes) const {
    std::set<CaptureNode> seen;
    std::vector<CaptureNode> todo;
    auto f = frontier_.find(s);
    if (f != frontier_.end()) todo.assign(f->second.begin(), f->second.end());
    while (!todo.empty()) {
      const CaptureNode n = todo.back();
      todo.pop_back();
      if (!seen.insert(n).second) continue;
      auto d = deps_.find(n);
      if (d != deps_.end()) todo.insert(todo.end(), d->second.begin(), d->second.end());
    }
    return std::includes(seen.begin(), seen.end(), nodes.begin(), nodes.end());
  }

 private:
  std::map<CaptureNode, std::set<CaptureNode>> deps_;
  std::map<Stream, std::set<CaptureNode>> frontier_;
};

class CaptureReuseRandomTest : public MemPoolFixture,
                               public ::testing::WithParamInterface<unsigned> {
 protected:
  struct Live {
    void* ptr;
    std::size_t bytes;
    Stream stream;
  };
  struct Freed {
    std::uintptr_t lo, hi;
    Stream owner;
    std::set<CaptureNode> uses;  // the frontiers of the owner and the use streams at the free
  };
};

TEST_P(CaptureReuseRandomTest, ReuseOnlyAfterEveryUseJoined) {
  std::mt19937 rng(GetParam());
  std::vector<Stream> streams = {s1_, s2_, *backend_->CreateStream(0), *backend_->CreateStream(0)};
  GraphModel graph;
  backend_->SetCapturing(s1_, true);
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr, {.reuse_after_join = true}).ok());
  for (std::size_t i = 1; i < streams.size(); ++i) {
    backend_->JoinCapture(streams[i], s1_);
    graph.Join(streams[i], s1_);
  }
  std::vector<Live> live;
  std::vector<Freed> freed;
  int reused = 0, cross_stream = 0;
  const std::size_t sizes[] = {32, 512, 4096, 3 << 19};
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  for (int op = 0; op < 1500; ++op) {
    const int what = static_cast<int>(rng() % 100);
    const Stream s = streams[pick(streams.size())];
    if (what < 40) {
      const std::size_t bytes = sizes[pick(4)];
      void* p = Alloc(bytes, 0, s);
      ASSERT_NE(p, nullptr);
      const auto lo = reinterpret_cast<std::uintptr_t>(p);
      for (auto f = freed.begin(); f != freed.end();) {
        if (lo < f->hi && f->lo < lo + bytes) {
          ++reused;
          if (f->owner != s) ++cross_stream;
          ASSERT_TRUE(graph.Follows(s, f->uses))
              << "op " << op << ": a block freed on stream " << f->owner
              << " came back to stream " << s << " before every use of it joined";
          f = freed.erase(f);  // its memory is this allocation's now
        } else {
          ++f;
        }
      }
      live.push_back({p, bytes, s});
    } else if (what < 65 && !live.empty()) {
      const std::size_t k = pick(live.size());
      const Live b = live[k];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      Freed f{reinterpret_cast<std::uintptr_t>(b.ptr),
              reinterpret_cast<std::uintptr_t>(b.ptr) + b.bytes, b.stream, {}};
      // Kernels on a few other streams read it (record_stream), then the
      // owner frees it.
      for (Stream u : streams) {
        if (u == b.stream || rng() % 3 != 0) continue;
        const CaptureNode n = backend_->AddCaptureNode(u);
        graph.Node(u, n);
        ASSERT_TRUE(alloc_->RecordStream(b.ptr, u).ok());
        for (CaptureNode x : graph.Frontier(u)) f.uses.insert(x);
      }
      for (CaptureNode x : graph.Frontier(b.stream)) f.uses.insert(x);
      ASSERT_TRUE(alloc_->Free(b.ptr).ok());
      freed.push_back(std::move(f));
    } else if (what < 85) {
      graph.Node(s, backend_->AddCaptureNode(s));
    } else {
      const Stream waited = streams[pick(streams.size())];
      if (waited == s) continue;
      backend_->JoinCapture(s, waited);
      graph.Join(s, waited);
    }
    if (op % 100 == 0) ExpectInvariants();
  }
  // The option did something: blocks came back inside the capture.
  EXPECT_GT(reused, 0);
  RecordProperty("reused", reused);
  RecordProperty("cross_stream", cross_stream);
  for (Stream s : streams) backend_->SetCapturing(s, false);
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
  for (const Live& b : live) ASSERT_TRUE(alloc_->Free(b.ptr).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
  for (std::size_t i = 2; i < streams.size(); ++i) {
    ASSERT_TRUE(backend_->CompleteWork(streams[i]).ok());
    ASSERT_TRUE(backend_->DestroyStream(streams[i]).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, CaptureReuseRandomTest, ::testing::Values(1u, 2u, 3u, 4u, 5u, 6u));

}  // namespace
}  // namespace cma
