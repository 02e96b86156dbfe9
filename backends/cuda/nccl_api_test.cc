// nccl_api's waits on non-blocking communicators, against the stand-in NCCL
// of fake_nccl.h (loaded through CMA_NCCL_LIBRARY, as a framework's own NCCL
// would be): a call waits for the communicator's previous operation before
// it uses it, then for itself; CMA_NCCL_TIMEOUT_S bounds each wait; NCCL's
// failures keep their kind. No GPU, no NCCL needed.
#include "backends/cuda/nccl_api.h"

#include <cstdint>
#include <cstdlib>
#include <limits>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/cuda/fake_nccl.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

CommHandle Handle(FakeNcclComm& c) { return reinterpret_cast<CommHandle>(&c); }

class NcclApiTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv("CMA_NCCL_TIMEOUT_S"); }
  void TearDown() override { unsetenv("CMA_NCCL_TIMEOUT_S"); }
  int window_storage_ = 0;
  void* const window_ = &window_storage_;
};

TEST_F(NcclApiTest, ABlockingCommunicatorRegistersAtOnce) {
  FakeNcclComm c;
  c.window = window_;
  absl::StatusOr<CommWindow> w = NcclRegisterWindow(Handle(c), window_, 4096);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, reinterpret_cast<CommWindow>(window_));
  EXPECT_EQ(c.registrations, 1);
  EXPECT_EQ(c.polls, 1);  // the one look at the communicator before the call
  EXPECT_TRUE(NcclDeregisterWindow(Handle(c), *w).ok());
  EXPECT_EQ(c.deregistrations, 1);
  EXPECT_EQ(c.polls, 2);
  EXPECT_EQ(c.used_while_busy, 0);
}

// A non-blocking communicator still initialising: nothing uses it before
// its initialisation has finished (NCCL 2.28.9 refused that on an H200).
TEST_F(NcclApiTest, EveryCallWaitsForTheCommunicatorsPreviousOperation) {
  FakeNcclComm c;
  c.window = window_;
  c.size = 4;
  c.rank = 3;
  c.busy_polls = 25;
  absl::StatusOr<CommFacts> f = NcclCommFacts(Handle(c));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size, 4);
  EXPECT_EQ(f->rank, 3);
  c.busy_polls = 25;
  absl::StatusOr<CommWindow> w = NcclRegisterWindow(Handle(c), window_, 4096);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, reinterpret_cast<CommWindow>(window_));
  c.busy_polls = 25;
  EXPECT_TRUE(NcclDeregisterWindow(Handle(c), *w).ok());
  EXPECT_EQ(c.used_while_busy, 0);
  EXPECT_EQ(c.busy_polls, 0);
}

TEST_F(NcclApiTest, AnInProgressRegistrationIsWaitedForAndItsWindowKept) {
  FakeNcclComm c;
  c.window = window_;
  c.call_polls = 40;
  absl::StatusOr<CommWindow> w = NcclRegisterWindow(Handle(c), window_, 4096);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, reinterpret_cast<CommWindow>(window_));
  EXPECT_EQ(c.busy_polls, 0);  // finished before it returned
  EXPECT_TRUE(NcclDeregisterWindow(Handle(c), *w).ok());
  EXPECT_EQ(c.busy_polls, 0);
  EXPECT_EQ(c.used_while_busy, 0);
}

TEST_F(NcclApiTest, ACommunicatorThatNeverFinishesGivesUpAfterTheTimeout) {
  setenv("CMA_NCCL_TIMEOUT_S", "0.05", 1);
  FakeNcclComm c;
  c.window = window_;
  c.busy_polls = std::numeric_limits<long>::max();  // initialising for ever
  const absl::Time start = absl::Now();
  absl::StatusOr<CommWindow> w = NcclRegisterWindow(Handle(c), window_, 4096);
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded) << w.status();
  EXPECT_THAT(w.status().message(), HasSubstr("CMA_NCCL_TIMEOUT_S"));
  EXPECT_THAT(w.status().message(), HasSubstr("ncclCommAbort"));
  EXPECT_THAT(w.status().message(), HasSubstr("before ncclCommWindowRegister"));
  EXPECT_GE(took, absl::Milliseconds(50));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(c.registrations, 0);  // never called on the busy communicator
  EXPECT_EQ(c.used_while_busy, 0);

  // The registration itself never finishing.
  FakeNcclComm d;
  d.window = window_;
  d.call_polls = std::numeric_limits<long>::max();
  w = NcclRegisterWindow(Handle(d), window_, 4096);
  ASSERT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded) << w.status();
  EXPECT_THAT(w.status().message(), HasSubstr("ncclCommWindowRegister was still in progress"));
  EXPECT_EQ(d.registrations, 1);
}

TEST_F(NcclApiTest, AFailureAfterInProgressKeepsNcclsKindAndMessage) {
  FakeNcclComm c;
  c.window = window_;
  c.call_polls = 5;
  c.async_error = 2;  // ncclSystemError
  c.last_error = "peer went away";
  absl::StatusOr<CommWindow> w = NcclRegisterWindow(Handle(c), window_, 4096);
  ASSERT_EQ(w.status().code(), absl::StatusCode::kInternal) << w.status();
  EXPECT_THAT(w.status().message(), HasSubstr("unhandled system error: peer went away"));

  FakeNcclComm d;
  d.register_result = 4;  // ncclInvalidArgument, at once
  w = NcclRegisterWindow(Handle(d), window_, 4096);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
}

TEST_F(NcclApiTest, ABadTimeoutIsRefusedBeforeAnyNcclCall) {
  for (const char* bad : {"abc", "0", "-1", ""}) {
    setenv("CMA_NCCL_TIMEOUT_S", bad, 1);
    FakeNcclComm c;
    c.window = window_;
    absl::StatusOr<CommWindow> w = NcclRegisterWindow(Handle(c), window_, 4096);
    if (bad[0] == '\0') {  // unset in effect: the default
      EXPECT_TRUE(w.ok()) << w.status();
      continue;
    }
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(w.status().message(), HasSubstr("CMA_NCCL_TIMEOUT_S")) << bad;
    EXPECT_EQ(c.registrations, 0) << bad;
    EXPECT_EQ(NcclDeregisterWindow(Handle(c), 1).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.deregistrations, 0) << bad;
    EXPECT_EQ(c.polls, 0) << bad;
  }
}

TEST_F(NcclApiTest, ANullCommunicatorIsRefused) {
  EXPECT_EQ(NcclCommFacts(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cma
