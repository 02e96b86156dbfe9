// The away state under injected faults (backends/fault): a Move that fails
// leaves an away allocation away and uncounted.
#include "absl/strings/str_cat.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class AwayFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = CachingManagedAllocator::Create(fault_, "");
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(*a);
    auto p = alloc_->Allocate(20 * kMiB, 0, kDefaultStream);
    ASSERT_TRUE(p.ok());
    a_ = *p;
    ASSERT_TRUE(alloc_->SendAway({&a_, 1}, kDefaultStream).ok());
    ASSERT_EQ(AwayBytes(), static_cast<std::int64_t>(16 * kMiB));
  }
  void TearDown() override {
    fault_.SetPlan({});
    EXPECT_TRUE(alloc_->Free(a_).ok());
    EXPECT_TRUE(alloc_->CheckInvariants().ok());
    alloc_.reset();
  }
  std::int64_t AwayBytes() { return alloc_->GetStats(0)->away_bytes[kAllPools].current; }
  std::int64_t Reserved() { return alloc_->GetStats(0)->reserved_bytes[kAllPools].current; }

  HostBackend host_{{.device_count = 1, .device_capacity = std::size_t{1} << 30}};
  FaultInjectingBackend fault_{host_};
  std::unique_ptr<CachingManagedAllocator> alloc_;
  void* a_ = nullptr;
};

TEST_F(AwayFaultTest, AFailedMoveLeavesTheAllocationAway) {
  const std::int64_t reserved = Reserved();
  fault_.SetPlan({.kind = FaultKind::kPrefetch, .fail_nth = 1});
  absl::Status s = alloc_->Move(a_, Location::Device(0), kDefaultStream);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(host_.PageLocation(static_cast<char*>(a_) + 8 * kMiB), kPageOnHost)
      << "nothing moved";
  EXPECT_EQ(AwayBytes(), static_cast<std::int64_t>(16 * kMiB))
      << "the failed move (" << s << ") took the away state";
  EXPECT_EQ(Reserved(), reserved) << "and counted its host pages in reserved_bytes";
}

}  // namespace
}  // namespace cma
