// The allocator's contract, run against every backend compiled in: always
// the host backend, and CUDA/HIP where a device is visible (skipped with the
// reason otherwise). Only Backend-interface calls are used here.
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/registry.h"
#include "bench/replay.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

class ConformanceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = MakeBackend(GetParam());
    if (!b.ok()) GTEST_SKIP() << "backend " << GetParam() << " unavailable: " << b.status();
    backend_ = std::move(*b);
    Make("");
  }
  void Make(const std::string& config) {
    alloc_.reset();
    auto a = CachingManagedAllocator::Create(*backend_, config);
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(*a);
  }
  void TearDown() override {
    if (!alloc_) return;
    EXPECT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    EXPECT_TRUE(alloc_->EmptyCache().ok());
    EXPECT_EQ(alloc_->GetStats().reserved_bytes[kAllPools].current, 0) << "leaked segments";
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CachingManagedAllocator> alloc_;
};

TEST_P(ConformanceTest, ManagedMemoryIsHostWritable) {
  auto p = alloc_->Allocate(3 << 20, 0);
  ASSERT_TRUE(p.ok()) << p.status();
  std::memset(*p, 0x5a, 3 << 20);
  EXPECT_EQ(static_cast<unsigned char*>(*p)[(3 << 20) - 1], 0x5a);
  ASSERT_TRUE(alloc_->Free(*p).ok());
}

TEST_P(ConformanceTest, SteadyStateReusesTheSameBlock) {
  Stream s = *backend_->CreateStream(0);
  for (std::size_t bytes : {std::size_t{512}, std::size_t{1} << 20, std::size_t{64} << 20}) {
    void* first = *alloc_->Allocate(bytes, 0, s);
    ASSERT_TRUE(alloc_->Free(first).ok());
    const auto allocs = alloc_->GetStats().num_device_alloc;
    for (int i = 0; i < 100; ++i) {
      void* p = *alloc_->Allocate(bytes, 0, s);
      ASSERT_EQ(p, first);
      ASSERT_TRUE(alloc_->Free(p).ok());
    }
    EXPECT_EQ(alloc_->GetStats().num_device_alloc, allocs);
  }
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
}

TEST_P(ConformanceTest, BadInputLeavesStateUnchanged) {
  void* keep = *alloc_->Allocate(4096, 0);
  void* gone = *alloc_->Allocate(4096, 0);
  ASSERT_TRUE(alloc_->Free(gone).ok());
  const std::string before = Fingerprint(*alloc_);
  const std::size_t total = backend_->GetDeviceFacts(0)->total_bytes;
  EXPECT_EQ(alloc_->Allocate(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->Allocate(total + 1, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->Allocate(64, -2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(alloc_->Allocate(64, 4096).status().code(), absl::StatusCode::kInvalidArgument);
  int local = 0;
  EXPECT_THAT(alloc_->Free(&local).message(), HasSubstr("foreign pointer"));
  EXPECT_THAT(alloc_->Free(gone).message(), HasSubstr("double free"));
  EXPECT_THAT(alloc_->Free(static_cast<char*>(keep) + 8).message(), HasSubstr("points 8 bytes"));
  EXPECT_EQ(Fingerprint(*alloc_), before);
  ASSERT_TRUE(alloc_->Free(keep).ok());
}

TEST_P(ConformanceTest, BudgetGivesClearOutOfMemory) {
  Make("managed_budget:64M");
  void* a = *alloc_->Allocate(40 << 20, 0);
  auto b = alloc_->Allocate(40 << 20, 0);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("managed budget"));
  EXPECT_EQ(alloc_->GetStats().num_ooms, 1);
  ASSERT_TRUE(alloc_->Free(a).ok());
  auto c = alloc_->Allocate(40 << 20, 0);  // works again
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(alloc_->Free(*c).ok());
}

TEST_P(ConformanceTest, RecordStreamThenFreeThenReuse) {
  Stream s1 = *backend_->CreateStream(0), s2 = *backend_->CreateStream(0);
  void* p = *alloc_->Allocate(1 << 20, 0, s1);
  ASSERT_TRUE(alloc_->RecordStream(p, s2).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s2).ok());
  void* q = *alloc_->Allocate(1 << 20, 0, s1);
  EXPECT_EQ(q, p);  // the event on s2 has completed
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(backend_->DestroyStream(s1).ok());
  ASSERT_TRUE(backend_->DestroyStream(s2).ok());
}

TEST_P(ConformanceTest, IdleStreamsFreeBlocksServeAnotherStream) {
  // The arena asks QueryStream whether s1 is idle before adopting its free
  // blocks for s2; a finished stream answers yes on every backend.
  Stream s1 = *backend_->CreateStream(0), s2 = *backend_->CreateStream(0);
  void* p = *alloc_->Allocate(6 << 20, 0, s1);
  ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1).ok());
  auto idle = backend_->QueryStream(s1);
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_TRUE(*idle);
  void* q = *alloc_->Allocate(6 << 20, 0, s2);
  EXPECT_EQ(q, p);
  EXPECT_GE(alloc_->GetStats().num_cross_stream_reuse, 1);
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  ASSERT_TRUE(backend_->DestroyStream(s1).ok());
  ASSERT_TRUE(backend_->DestroyStream(s2).ok());
}

TEST_P(ConformanceTest, ReplaysResnetTrace) {
  Make("release_before_peak:1");
  auto ops = ReadTrace("bench/traces/resnet50_train.csv.gz");
  ASSERT_TRUE(ops.ok()) << ops.status();
  auto r = Replay(*alloc_, 0, *ops, "resnet50");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ooms, 0);
  EXPECT_LT(r->ratio, 1.06);
}

TEST_P(ConformanceTest, HostFunctionsRunAfterTheWorkBeforeThemInOrder) {
  auto s = backend_->CreateStream(0);
  ASSERT_TRUE(s.ok()) << s.status();
  std::atomic<int> seen{0};
  std::vector<int> order;  // written only by the functions, one after another
  for (int i = 1; i <= 3; ++i) {
    absl::Status l = backend_->LaunchHostFunction(*s, [&, i] {
      order.push_back(i);
      seen.fetch_add(1);
    });
    ASSERT_TRUE(l.ok()) << l;
  }
  ASSERT_TRUE(backend_->SynchronizeStream(*s).ok());
  EXPECT_EQ(seen.load(), 3);
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
  ASSERT_TRUE(backend_->DestroyStream(*s).ok());
}

TEST_P(ConformanceTest, PlacementCallsReachTheBackend) {
  void* p = *alloc_->Allocate(4 << 20, 0);
  ASSERT_TRUE(backend_->Advise(p, 4 << 20, Advice::kSetPreferredLocation, Location::Device(0)).ok());
  ASSERT_TRUE(backend_->Prefetch(p, 4 << 20, Location::Host(), kDefaultStream).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(kDefaultStream).ok());
  auto attr = backend_->GetRangeAttributes(p, 4 << 20);
  ASSERT_TRUE(attr.ok()) << attr.status();
  EXPECT_TRUE(attr->has_preferred_location);
  EXPECT_EQ(attr->preferred_location, Location::Device(0));
  EXPECT_TRUE(attr->last_prefetch_location.is_host());
  ASSERT_TRUE(backend_->Advise(p, 4 << 20, Advice::kUnsetPreferredLocation, Location::Device(0)).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, ConformanceTest, ::testing::Values("host", "cuda", "hip"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cma
