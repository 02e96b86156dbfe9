// Reuse inside a capture of a block freed there while other streams used it
// (PyTorch's graph_capture_record_stream_reuse; allocator/capture_reuse.h),
// on the host backend's emulated capture graph. The first two tests are
// PyTorch's own test_graph_capture_reclaim_2_streams and _4_streams, step
// by step: each torch op that records a kernel is one AddCaptureNode, each
// wait_stream one JoinCapture.
#include <vector>

#include "allocator/capture_reuse.h"
#include "gmock/gmock.h"
#include "tests/mempool_test_util.h"

namespace cma {
namespace {

constexpr MemPoolId kPool{7, 0};
constexpr PoolContextOptions kReuse{.reuse_after_join = true};

class CaptureReuseTest : public MemPoolFixture {
 protected:
  void SetUp() override {
    MemPoolFixture::SetUp();
    s3_ = *backend_->CreateStream(0);
    s4_ = *backend_->CreateStream(0);
  }
  void TearDown() override {
    for (Stream s : {s3_, s4_}) ASSERT_TRUE(backend_->CompleteWork(s).ok());
    MemPoolFixture::TearDown();
  }
  // capture_begin on `origin` into kPool (every stream's allocations go to
  // the pool, as the capture's filter would take every joined stream).
  void Begin(Stream origin, PoolContextOptions options = kReuse) {
    backend_->SetCapturing(origin, true);
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, kPool, nullptr, options).ok());
  }
  // A block of s1's that a kernel captured on s2 reads (s2 forked from s1),
  // freed: PyTorch's record_stream then del.
  void* FreedAfterAReadOnS2() {
    void* p = Alloc(32, 0, s1_);
    backend_->JoinCapture(s2_, s1_);
    backend_->AddCaptureNode(s2_);
    EXPECT_TRUE(alloc_->RecordStream(p, s2_).ok());
    EXPECT_TRUE(alloc_->Free(p).ok());
    return p;
  }
  void End() {
    for (Stream s : {s1_, s2_, s3_, s4_}) backend_->SetCapturing(s, false);
    ASSERT_TRUE(alloc_->EndAllocateToPool(0, kPool).ok());
    ExpectInvariants();
  }
  Stream s3_ = 0, s4_ = 0;
};

TEST_F(CaptureReuseTest, TwoStreamsReuseOnlyAfterTheJoin) {
  Begin(s1_);
  void* sink1 = Alloc(32, 0, s1_);
  void* data1 = Alloc(32, 0, s1_);
  backend_->JoinCapture(s2_, s1_);  // s2.wait_stream(s1)
  void* buf2 = Alloc(32, 0, s2_);
  backend_->AddCaptureNode(s2_);  // torch.add(data1, 2.0, out=buf2)
  ASSERT_TRUE(alloc_->RecordStream(data1, s2_).ok());
  const std::int64_t before = UncapturableCalls();
  ASSERT_TRUE(alloc_->Free(data1).ok());
  void* data2 = Alloc(32, 0, s1_);
  EXPECT_NE(data2, data1) << "reused before s1 waited for s2's use";
  backend_->JoinCapture(s1_, s2_);  // s1.wait_stream(s2)
  backend_->AddCaptureNode(s1_);    // sink1.fill_(1.0)
  void* data3 = Alloc(32, 0, s1_);
  EXPECT_EQ(data3, data1) << "not reused after the join";
  EXPECT_EQ(UncapturableCalls(), before) << "a capture-breaking call during the capture";
  ExpectInvariants();
  End();
  for (void* p : {sink1, buf2, data2, data3}) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

TEST_F(CaptureReuseTest, FourStreamsReuseOnlyAfterEveryUseJoined) {
  Begin(s1_);
  void* data1 = Alloc(32, 0, s1_);
  backend_->AddCaptureNode(s1_);  // torch.ones
  void* sink1 = Alloc(32, 0, s1_);
  void* sink3 = Alloc(32, 0, s1_);
  std::vector<void*> bufs;
  for (Stream s : {s2_, s3_, s4_}) {
    backend_->JoinCapture(s, s1_);
    bufs.push_back(Alloc(32, 0, s));
    backend_->AddCaptureNode(s);  // torch.add(data1, k, out=buf)
    ASSERT_TRUE(alloc_->RecordStream(data1, s).ok());
  }
  ASSERT_TRUE(alloc_->Free(data1).ok());
  backend_->JoinCapture(s1_, s2_);  // partial joins
  backend_->AddCaptureNode(s1_);
  backend_->JoinCapture(s3_, s4_);
  backend_->AddCaptureNode(s3_);
  ASSERT_TRUE(alloc_->RecordStream(sink3, s3_).ok());
  void* data2 = Alloc(32, 0, s1_);
  EXPECT_NE(data2, data1) << "reused before s3's and s4's uses joined s1";
  backend_->JoinCapture(s1_, s3_);  // the final join
  backend_->AddCaptureNode(s1_);    // sink1.add_(sink3)
  void* data3 = Alloc(32, 0, s1_);
  EXPECT_EQ(data3, data1);
  End();
  for (void* p : {sink1, sink3, data2, data3}) ASSERT_TRUE(alloc_->Free(p).ok());
  for (void* p : bufs) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

// Off by default: the block waits for the context's end (PyTorch's default).
TEST_F(CaptureReuseTest, WithoutTheOptionTheBlockWaitsForTheEnd) {
  Begin(s1_, PoolContextOptions{});
  void* data1 = FreedAfterAReadOnS2();
  backend_->JoinCapture(s1_, s2_);
  backend_->AddCaptureNode(s1_);
  void* data3 = Alloc(32, 0, s1_);
  EXPECT_NE(data3, data1);
  EXPECT_EQ(backend_->CallCount("CaptureFrontierOf"), 0) << "asked for topology it does not use";
  End();
  ASSERT_TRUE(alloc_->Free(data3).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// A use on a stream outside the capture is ordered by no node of it: only
// the events the context's end records order it.
TEST_F(CaptureReuseTest, AUseOutsideTheCaptureWaitsForTheEnd) {
  Begin(s1_);
  void* data1 = Alloc(32, 0, s1_);
  ASSERT_TRUE(alloc_->RecordStream(data1, s3_).ok());  // s3 is not capturing
  ASSERT_TRUE(alloc_->Free(data1).ok());
  backend_->AddCaptureNode(s1_);
  void* data3 = Alloc(32, 0, s1_);
  EXPECT_NE(data3, data1);
  const std::int64_t events = backend_->CallCount("RecordEvent");
  End();
  EXPECT_GT(backend_->CallCount("RecordEvent"), events) << "the end fences s3's use";
  ASSERT_TRUE(alloc_->Free(data3).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// Two captures at once (two threads capturing on their own streams into
// their own pools): a node of one capture never orders the other's frees.
TEST_F(CaptureReuseTest, AnotherCapturesJoinsDoNotCount) {
  Begin(s1_);
  void* data1 = Alloc(32, 0, s1_);
  backend_->SetCapturing(s3_, true);  // a second capture sequence
  backend_->AddCaptureNode(s3_);
  ASSERT_TRUE(alloc_->RecordStream(data1, s3_).ok());
  ASSERT_TRUE(alloc_->Free(data1).ok());
  backend_->AddCaptureNode(s1_);
  void* data3 = Alloc(32, 0, s1_);
  EXPECT_NE(data3, data1);
  End();
  ASSERT_TRUE(alloc_->Free(data3).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// Another stream's joins do not order the block's own stream: a stream that
// waited for every use must not free the block for its owner, which did not.
TEST_F(CaptureReuseTest, OnlyTheOwnersJoinsCount) {
  Begin(s1_);
  void* data1 = FreedAfterAReadOnS2();
  backend_->JoinCapture(s3_, s2_);  // s3 waited for s2's use (and so s1's)
  backend_->AddCaptureNode(s3_);
  const std::int64_t asked = backend_->CallCount("CaptureFrontierOf");
  void* on3 = Alloc(32, 0, s3_);
  EXPECT_EQ(backend_->CallCount("CaptureFrontierOf"), asked) << "no block of s3's waits: no query";
  void* on1 = Alloc(32, 0, s1_);  // s1 never waited for s2
  EXPECT_NE(on1, data1) << "s1 reused a block s2 may still read";
  End();
  for (void* p : {on1, on3}) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
}

// A block reused inside the capture is the pool's, as any free block is:
// after the capture it serves the pool only, and a free in the shared cache
// never takes it.
TEST_F(CaptureReuseTest, AReclaimedBlockStaysThePools) {
  Begin(s1_);
  void* data1 = FreedAfterAReadOnS2();
  backend_->JoinCapture(s1_, s2_);
  backend_->AddCaptureNode(s1_);
  void* big = Alloc(4 << 20, 0, s1_);  // reclaims data1 into the pool's free blocks
  End();
  void* shared = Alloc(32, 0, s1_);
  EXPECT_NE(shared, data1) << "a block of a live pool served the shared cache";
  ASSERT_TRUE(alloc_->Free(shared).ok());
  ASSERT_TRUE(alloc_->Free(big).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, kPool).ok());
  ExpectInvariants();
}

// The walk behind the decision, on a graph given by a table.
TEST(CaptureAncestorsTest, ReachesAncestorsOnlyWithinItsBound) {
  // 1 <- 2 <- 4, 1 <- 3 <- 4 (a diamond), 5 alone; 9 fails to look up.
  auto deps = [](CaptureNode n) -> absl::StatusOr<std::vector<CaptureNode>> {
    switch (n) {
      case 4: return std::vector<CaptureNode>{2, 3};
      case 2: case 3: return std::vector<CaptureNode>{1};
      case 6: return std::vector<CaptureNode>{9};
      case 9: return absl::InvalidArgumentError("no such node");
      default: return std::vector<CaptureNode>{};
    }
  };
  CaptureAncestors from4({4}, deps, 100);
  EXPECT_TRUE(from4.ReachesAll({1, 2, 3, 4}));
  EXPECT_FALSE(from4.ReachesAll({1, 5}));
  EXPECT_TRUE(from4.ReachesAll({}));
  CaptureAncestors small({4}, deps, 2);
  EXPECT_FALSE(small.ReachesAll({1})) << "walked past its bound";
  CaptureAncestors broken({6, 4}, deps, 100);
  EXPECT_FALSE(broken.ReachesAll({1})) << "a failed lookup must answer no";
  EXPECT_TRUE(broken.ReachesAll({6})) << "the frontier itself is always reached";
}

}  // namespace
}  // namespace cma
