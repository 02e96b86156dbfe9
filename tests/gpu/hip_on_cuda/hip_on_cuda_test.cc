// The HIP backend through hip_on_cuda's libamdhip64.so. Without a GPU (CI):
// the library loads, every symbol the backend needs resolves, and the
// missing device is reported with CUDA's reason behind HIP's. With an
// NVIDIA GPU: what the conformance suite does not reach, namely HIP's error
// codes as the backend maps them, stale handles, range attributes, VMM with
// a POSIX FD, and ROCm's managed-memory rules end to end (the target name
// is overridden to a gfx90a with XNACK off).
#include <cstdlib>
#include <cstring>
#include <string>
#include <unistd.h>

#include "allocator/caching_managed_allocator.h"
#include "backends/hip/hip_api.h"
#include "backends/hip/hip_backend.h"
#include "backends/hip/hip_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

// Before anything loads the runtime: the library beside this test (bazel
// test runs in the runfiles tree) unless the caller chose one.
const bool kLibraryChosen = [] {
  if (std::getenv("CMA_HIP_LIBRARY") == nullptr) {
    char* abs = realpath("tests/gpu/hip_on_cuda/libamdhip64.so", nullptr);
    if (abs != nullptr) setenv("CMA_HIP_LIBRARY", abs, 1);
    std::free(abs);
  }
  return true;
}();

TEST(HipOnCudaTest, LoadsAndNamesTheRuntime) {
  auto api = HipApi::Get();
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ((*api)->library, std::getenv("CMA_HIP_LIBRARY"));  // the one chosen, nothing else
  ASSERT_NE((*api)->hipRuntimeGetVersion, nullptr);
  // HIP's codes and names, not CUDA's (cudaErrorNotReady is 600 as well, but
  // is named differently).
  EXPECT_STREQ((*api)->hipGetErrorName(hipErrorNotReady), "hipErrorNotReady");
  EXPECT_STREQ((*api)->hipGetErrorName(hipErrorContextIsDestroyed), "hipErrorContextIsDestroyed");
  EXPECT_EQ(HipStatus(**api, hipErrorContextIsDestroyed, "hipStreamGetFlags").code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HipOnCudaTest, WithoutAGpuTheReasonIsCudas) {
  auto b = MakeHipBackend();
  if (b.ok()) GTEST_SKIP() << "a GPU is visible";
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(b.status().message(), HasSubstr("no HIP device is visible"));
}

class HipOnCudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = MakeHipBackend();
    if (!b.ok()) GTEST_SKIP() << "no GPU: " << b.status();
    backend_ = std::move(*b);
  }
  std::unique_ptr<Backend> backend_;
};

TEST_F(HipOnCudaGpuTest, FactsNameTheRuntimeAndItsMigration) {
  auto f = backend_->GetDeviceFacts(0);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(f->runtime, HasSubstr(std::getenv("CMA_HIP_LIBRARY")));
  EXPECT_EQ(f->xnack, "absent");  // "sm_90": no xnack feature
  EXPECT_TRUE(f->concurrent_managed_access);
  EXPECT_TRUE(f->page_fault_migration);
  EXPECT_GT(f->vmm_granularity, 0u);
}

TEST_F(HipOnCudaGpuTest, ErrorsAreHipsAndNameTheCall) {
  int not_managed[64];
  absl::Status s = backend_->Advise(not_managed, sizeof(not_managed), Advice::kSetReadMostly,
                                    Location::Device(0));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("hipMemAdvise failed: hipErrorInvalidValue"));
  EXPECT_THAT(s.message(), HasSubstr("cudaErrorInvalidValue"));  // what CUDA said behind it
}

TEST_F(HipOnCudaGpuTest, StaleStreamsAndEventsAreInvalidArguments) {
  Stream s = *backend_->CreateStream(0);
  ASSERT_TRUE(backend_->ValidateStream(0, s).ok());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
  absl::Status v = backend_->ValidateStream(0, s);
  EXPECT_EQ(v.code(), absl::StatusCode::kInvalidArgument) << v;
  Event e = *backend_->CreateEvent(0);
  ASSERT_TRUE(backend_->DestroyEvent(e).ok());
  EXPECT_EQ(backend_->QueryEvent(e).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HipOnCudaGpuTest, AdviceAndPrefetchShowInRangeAttributes) {
  constexpr std::size_t kBytes = 8 << 20;
  void* p = *backend_->AllocateManaged(0, kBytes);
  Stream s = *backend_->CreateStream(0);
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kSetReadMostly, Location::Device(0)).ok());
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kSetAccessedBy, Location::Device(0)).ok());
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kSetCoarseGrain, Location::Device(0)).ok());
  ASSERT_TRUE(backend_->Prefetch(p, kBytes, Location::Device(0), s).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s).ok());
  auto a = backend_->GetRangeAttributes(p, kBytes);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->read_mostly);
  EXPECT_TRUE(a->has_last_prefetch);
  EXPECT_EQ(a->last_prefetch_location, Location::Device(0));
  EXPECT_THAT(a->accessed_by, ::testing::ElementsAre(0));
  EXPECT_FALSE(a->has_preferred_location);
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kSetPreferredLocation, Location::Host()).ok());
  ASSERT_TRUE(backend_->Prefetch(p, kBytes, Location::Host(), s).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s).ok());
  a = backend_->GetRangeAttributes(p, kBytes);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->has_preferred_location);
  EXPECT_TRUE(a->preferred_location.is_host());
  EXPECT_TRUE(a->last_prefetch_location.is_host());
  ASSERT_TRUE(backend_->DestroyStream(s).ok());
  ASSERT_TRUE(backend_->FreeManaged(p).ok());
}

TEST_F(HipOnCudaGpuTest, VmmWithAPosixFdRoundTrips) {
  auto g = backend_->VmmGranularity(0);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::size_t bytes = *g;
  auto h = backend_->VmmCreate(0, bytes, HandleType::kPosixFd);
  ASSERT_TRUE(h.ok()) << h.status();
  auto fd = backend_->VmmExport(*h, HandleType::kPosixFd);
  ASSERT_TRUE(fd.ok()) << fd.status();
  auto imported = backend_->VmmImport(*fd);
  ASSERT_TRUE(imported.ok()) << imported.status();
  close(fd->fd);
  void* va = *backend_->VmmReserve(bytes, bytes);
  ASSERT_TRUE(backend_->VmmMap(va, bytes, *imported).ok());
  const int dev[] = {0};
  ASSERT_TRUE(backend_->VmmSetAccess(va, bytes, dev).ok());
  ASSERT_TRUE(backend_->VmmUnmap(va, bytes).ok());
  ASSERT_TRUE(backend_->VmmFreeAddress(va, bytes).ok());
  ASSERT_TRUE(backend_->VmmRelease(*imported).ok());
  ASSERT_TRUE(backend_->VmmRelease(*h).ok());
}

TEST_F(HipOnCudaGpuTest, XnackOffRefusesFirstTouchPoliciesEndToEnd) {
  // What an MI250X without HSA_XNACK=1 reports; the backend's rules and the
  // allocator's refusal run exactly as they would there.
  setenv("HIP_ON_CUDA_GCN_ARCH_NAME", "gfx90a:sramecc+:xnack-", 1);
  unsetenv("HSA_XNACK");
  auto f = backend_->GetDeviceFacts(0);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->xnack, "off");
  EXPECT_FALSE(f->page_fault_migration);
  auto a = CachingManagedAllocator::Create(*backend_, "prefetch:none");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.status().message(), HasSubstr("XNACK off (target gfx90a:sramecc+:xnack-"));
  EXPECT_THAT(a.status().message(), HasSubstr("Run with HSA_XNACK=1"));
  auto ok = CachingManagedAllocator::Create(*backend_, "");
  EXPECT_TRUE(ok.ok()) << ok.status();
  unsetenv("HIP_ON_CUDA_GCN_ARCH_NAME");
}

}  // namespace
}  // namespace cma
