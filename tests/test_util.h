// Shared helpers for allocator tests on the host backend.
#ifndef CMA_TESTS_TEST_UTIL_H_
#define CMA_TESTS_TEST_UTIL_H_

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/host/host_backend.h"
#include "gtest/gtest.h"

namespace cma {

// Everything observable about an allocator's state, as one string: two equal
// fingerprints mean the state did not change.
inline std::string Fingerprint(CachingManagedAllocator& a) {
  std::string out;
  for (int d = 0; d < a.device_count(); ++d) {
    for (auto& [k, v] : a.GetStats(d)->Flatten()) absl::StrAppend(&out, d, ":", k, "=", v, ";");
  }
  for (auto& [k, v] : a.GetHostStats().Flatten()) absl::StrAppend(&out, "host:", k, "=", v, ";");
  for (const SegmentSnapshot& s : a.Snapshot()) {
    absl::StrAppend(&out, "|seg ", s.device, " ", s.address, " ", s.total_size);
    for (const BlockSnapshot& b : s.blocks) {
      absl::StrAppend(&out, " [", b.address, " ", b.size, " ", b.requested, " ", b.state, " ",
                      b.stream, "]");
    }
  }
  return out;
}

class AllocatorTest : public ::testing::Test {
 protected:
  void Make(HostBackendOptions options = {}, const std::string& config = "") {
    alloc_.reset();
    backend_ = std::make_unique<HostBackend>(options);
    auto a = CachingManagedAllocator::Create(*backend_, config);
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(*a);
  }
  void SetUp() override { Make(); }
  void TearDown() override {
    if (alloc_) {
      EXPECT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    }
    alloc_.reset();
    if (backend_) {
      // Nothing leaks: the allocator gave every backend resource back.
      HostResourceCounts live = backend_->LiveResources();
      EXPECT_EQ(live.managed_allocations, 0);
      EXPECT_EQ(live.events, 0);
    }
  }
  void* Alloc(std::size_t n, int device = 0, Stream s = kDefaultStream) {
    auto p = alloc_->Allocate(n, device, s);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : nullptr;
  }
  DeviceStats Stats(int device = 0) { return *alloc_->GetStats(device); }
  void ExpectInvariants() {
    absl::Status s = alloc_->CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }

  std::unique_ptr<HostBackend> backend_;
  std::unique_ptr<CachingManagedAllocator> alloc_;
};

}  // namespace cma

#endif  // CMA_TESTS_TEST_UTIL_H_
