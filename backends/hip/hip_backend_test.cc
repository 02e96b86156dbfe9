// The HIP backend where there is no AMD GPU (this project's machines): it
// builds, links, loads the runtime if installed and reports clearly what is
// missing. With an AMD GPU the device tests run.
#include "backends/hip/hip_backend.h"

#include <cstdio>
#include <cstdlib>

#include "backends/hip/hip_api.h"
#include "backends/hip/hip_status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

TEST(HipBackendTest, WithoutADeviceTheReasonIsClear) {
  auto b = MakeHipBackend();
  if (b.ok()) GTEST_SKIP() << "an AMD GPU is visible: see HipDeviceTest";
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(b.status().message(), ::testing::AnyOf(HasSubstr("no HIP device is visible"),
                                                     HasSubstr("HIP runtime is not installed")));
}

TEST(HipBackendTest, ErrorsNameTheCallAndMapCodes) {
  auto api = HipApi::Get();
  if (!api.ok()) GTEST_SKIP() << api.status();
  absl::Status oom = HipStatus(**api, hipErrorOutOfMemory, "hipMallocManaged");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(oom.message(), HasSubstr("hipMallocManaged failed: hipErrorOutOfMemory"));
  EXPECT_EQ(HipStatus(**api, hipErrorInvalidValue, "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HipStatus(**api, hipErrorNotSupported, "x").code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(HipStatus(**api, hipSuccess, "x").ok());
}

TEST(HipBackendTest, ChosenLibraryThatDoesNotExistIsAnErrorNotAFallback) {
  // A fresh process (HipApi::Get loads once per process).
  ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  EXPECT_EXIT(
      {
        setenv("CMA_HIP_LIBRARY", "/nonexistent/libamdhip64.so", 1);
        auto api = HipApi::Get();
        std::fprintf(stderr, "%s\n", api.status().ToString().c_str());
        std::_Exit(!api.ok() && api.status().code() == absl::StatusCode::kUnavailable ? 0 : 1);
      },
      ::testing::ExitedWithCode(0),
      "CMA_HIP_LIBRARY names /nonexistent/libamdhip64.so, which does not exist");
}

TEST(HipDeviceTest, ManagedMemoryAndFacts) {
  auto b = MakeHipBackend();
  if (!b.ok()) GTEST_SKIP() << "no AMD GPU: " << b.status();
  auto facts = (*b)->GetDeviceFacts(0);
  ASSERT_TRUE(facts.ok()) << facts.status();
  EXPECT_FALSE(facts->multicast_supported);
  auto p = (*b)->AllocateManaged(0, 1 << 20);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*b)->Advise(*p, 1 << 20, Advice::kSetCoarseGrain, Location::Device(0)).ok());
  EXPECT_TRUE((*b)->Prefetch(*p, 1 << 20, Location::Device(0), kDefaultStream).ok());
  EXPECT_TRUE((*b)->SynchronizeStream(kDefaultStream).ok());
  EXPECT_EQ((*b)->MulticastCreate({}, 0).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE((*b)->FreeManaged(*p).ok());
}

}  // namespace
}  // namespace cma
