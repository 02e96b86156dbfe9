// TransferThread (allocator/transfer_thread.h): calls run in the order they
// were handed over, WaitIssued and Drain return only once the calls before
// them have returned, failures are counted, and the destructor drains.
#include "allocator/transfer_thread.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"

namespace cma {
namespace {

TEST(TransferThreadTest, CallsRunInOrderAndWaitIssuedWaitsForThem) {
  TransferThread t;
  absl::Notification release;
  std::vector<int> order;  // written by the transfer thread only
  std::atomic<int> done{0};
  const std::uint64_t first = t.Submit([&] {
    release.WaitForNotification();  // a call that blocks, as the driver's did
    order.push_back(1);
    ++done;
    return absl::OkStatus();
  });
  std::uint64_t last = first;
  for (int i = 2; i <= 5; ++i) {
    last = t.Submit([&order, &done, i] {
      order.push_back(i);
      ++done;
      return absl::OkStatus();
    });
  }
  EXPECT_EQ(last, first + 4);
  EXPECT_EQ(done.load(), 0) << "the submitter did not wait";
  release.Notify();
  t.WaitIssued(first + 2);
  EXPECT_GE(done.load(), 3);
  t.Drain();
  EXPECT_EQ(done.load(), 5);
  EXPECT_THAT(order, ::testing::ElementsAre(1, 2, 3, 4, 5));
}

TEST(TransferThreadTest, FailuresAreKeptByTicketWithTheLastStatus) {
  TransferThread t;
  const std::uint64_t a = t.Submit([] { return absl::InternalError("first"); });
  t.Submit([] { return absl::OkStatus(); });
  const std::uint64_t c = t.Submit([] { return absl::UnavailableError("second"); });
  t.Drain();
  EXPECT_TRUE(t.HasFailures());
  absl::Status last;
  EXPECT_THAT(t.TakeFailures(&last), ::testing::ElementsAre(a, c));
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(t.HasFailures()) << "taken once";
  EXPECT_TRUE(t.TakeFailures(nullptr).empty());
}

TEST(TransferThreadTest, TheDestructorMakesEveryCallFirst) {
  std::atomic<int> done{0};
  {
    TransferThread t;
    for (int i = 0; i < 100; ++i) {
      t.Submit([&done] {
        ++done;
        return absl::OkStatus();
      });
    }
  }
  EXPECT_EQ(done.load(), 100);
}

TEST(TransferThreadTest, WaitingForNothingReturns) {
  TransferThread t;
  t.Drain();
  t.WaitIssued(0);
}

}  // namespace
}  // namespace cma
