// EmptyCache discards a page shared by several streams' free blocks only
// once it has waited for every one of them: a stream that cannot be waited
// for (an injected failure of the first or second wait) keeps the page.
#include "allocator/caching_managed_allocator.h"
#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"
#include "gtest/gtest.h"

namespace cma {
namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(ArenaSettleFaultTest, AStreamThatCannotBeWaitedForKeepsTheMixedPage) {
  for (int nth = 1; nth <= 2; ++nth) {
    SCOPED_TRACE(nth);
    HostBackend host({.device_count = 1, .device_capacity = 64 * kMiB, .manual_completion = true});
    FaultInjectingBackend faulty(host);
    auto a = CachingManagedAllocator::Create(faulty, "");
    ASSERT_TRUE(a.ok());
    Stream s1 = *host.CreateStream(0), s2 = *host.CreateStream(0);
    void* x = *(*a)->Allocate(3 * kMiB, 0, s1);
    void* y = *(*a)->Allocate(3 * kMiB, 0, s2);  // page 1 shared by x's end and y's start
    void* live = *(*a)->Allocate(2 * kMiB, 0, s1);
    ASSERT_TRUE(host.EnqueueWork(s2).ok());
    ASSERT_TRUE(host.EnqueueWork(s1).ok());
    ASSERT_TRUE((*a)->Free(x).ok());
    ASSERT_TRUE((*a)->Free(y).ok());
    faulty.SetPlan({.kind = FaultKind::kStreamSync, .fail_nth = nth});
    ASSERT_TRUE((*a)->EmptyCache().ok());
    faulty.SetPlan({});
    // Whichever stream could not be waited for: the shared page stays.
    EXPECT_EQ((*a)->GetStats(0)->idle_populated_bytes, static_cast<std::int64_t>(2 * kMiB));
    EXPECT_TRUE((*a)->CheckInvariants().ok());
    ASSERT_TRUE(host.CompleteWork(s1).ok());
    ASSERT_TRUE(host.CompleteWork(s2).ok());
    ASSERT_TRUE((*a)->Free(live).ok());
    a->reset();
    (void)host.DestroyStream(s1);
    (void)host.DestroyStream(s2);
  }
}

}  // namespace
}  // namespace cma
