// When the rendezvous fails, every process learns what happened and who is
// at fault, and nothing is left behind: a missing member is named to the
// members already in (not "timed out waiting for process 0"); a process 0
// that goes away is told apart from one that rejects (kUnavailable, not
// kPermissionDenied); a rejected member is told why; a process 0 killed
// leaves no file behind. Real processes (fork) on real Unix sockets.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/wire.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/fork_util.h"
#include "tests/rendezvous_test_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Path(const char* test) { return SocketPath("rdvf", test); }

// Prints `s` from a child (whose gtest expectations the parent never sees)
// and returns whether it matches.
bool Check(bool ok, const absl::Status& s) {
  if (!ok) std::fprintf(stderr, "pid %d got: %s\n", getpid(), s.ToString().c_str());
  return ok;
}

// Issue 19, item 9: process 2 never comes. Process 0 names it, and so does
// process 1's first AllGather (process 0 welcomes only once all are in).
TEST(RendezvousFailureTest, AMissingMemberIsNamedToEveryMemberAlreadyIn) {
  const std::string path = Path("missing");
  const std::string token = *MakeRendezvousToken();
  const absl::Duration timeout = absl::Seconds(2);
  const pid_t root = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 0, 3, timeout, token);
    return Check(x.status().code() == absl::StatusCode::kDeadlineExceeded &&
                     absl::StrContains(x.status().message(), "process 2 (of 3)"),
                 x.status());
  });
  const pid_t member = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 1, 3, timeout, token);
    if (!Check(x.ok(), x.status())) return false;
    auto all = (*x)->AllGather({"member 1", {}});
    return Check(all.status().code() == absl::StatusCode::kDeadlineExceeded &&
                     absl::StrContains(all.status().message(), "process 2 (of 3)") &&
                     !absl::StrContains(all.status().message(), "waiting for process 0"),
                 all.status());
  });
  EXPECT_EQ(Wait(member), 0);
  EXPECT_EQ(Wait(root), 0);
}

// A member already in that dies before the others are frees its index (it
// may come back) and is named when the rendezvous times out.
TEST(RendezvousFailureTest, AMemberThatLeavesBeforeTheOthersIsNamed) {
  const std::string path = Path("dies");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 0, 3, absl::Seconds(2), token);
    return Check(x.status().code() == absl::StatusCode::kDeadlineExceeded &&
                     absl::StrContains(x.status().message(), "processes 1, 2 (of 3)") &&
                     absl::StrContains(x.status().message(), "process 1 (pid ") &&
                     absl::StrContains(x.status().message(), "had connected and left"),
                 x.status());
  });
  const pid_t member = Spawn([&] {
    return MakeUnixSocketExchange(path, 1, 3, absl::Seconds(2), token).ok();  // then exits
  });
  EXPECT_EQ(Wait(member), 0);
  EXPECT_EQ(Wait(root), 0);
}

// Issue 19, item 10: a process 0 that goes away in the middle of the
// handshake is kUnavailable saying so, not a rejection.
TEST(RendezvousFailureTest, AProcessZeroThatGoesAwayIsNotARejection) {
  const std::string path = Path("gone");
  const std::string token = *MakeRendezvousToken();
  const int l = ListenAt(path);
  ASSERT_GE(l, 0);
  const pid_t member = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 1, 2, absl::Seconds(10), token);
    return Check(x.status().code() == absl::StatusCode::kUnavailable &&
                     absl::StrContains(x.status().message(), "closed the connection") &&
                     absl::StrContains(x.status().message(), "exited or was killed"),
                 x.status());
  });
  // Process 0's part, up to its death: it reads the hello and vanishes.
  const int c = accept(l, nullptr, nullptr);
  ASSERT_GE(c, 0);
  std::string hello(wire::kHelloBytes, '\0');
  ASSERT_TRUE(wire::ReadAll(c, hello.data(), hello.size(), absl::Now() + absl::Seconds(10), "m")
                  .ok());
  close(c);
  EXPECT_EQ(Wait(member), 0);
  close(l);
  unlink(path.c_str());
}

// The same when the real process 0 is killed after letting the member in:
// the member's first AllGather says process 0 went away.
TEST(RendezvousFailureTest, AProcessZeroKilledBeforeItsWelcomeIsNamed) {
  const std::string path = Path("killed");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] {
    return MakeUnixSocketExchange(path, 0, 3, absl::Seconds(10), token).ok();
  });
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t member = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 1, 3, absl::Seconds(10), token);
    if (!Check(x.ok(), x.status())) return false;
    (void)!write(ready[1], "r", 1);
    auto all = (*x)->AllGather({"member 1", {}});
    return Check(all.status().code() == absl::StatusCode::kUnavailable &&
                     absl::StrContains(all.status().message(), "before welcoming this process"),
                 all.status());
  });
  char r;
  ASSERT_EQ(read(ready[0], &r, 1), 1);
  kill(root, SIGKILL);
  EXPECT_EQ(Wait(root), 128 + SIGKILL);
  EXPECT_EQ(Wait(member), 0);
  close(ready[0]);
  close(ready[1]);
  unlink(path.c_str());
}

// Issue 34, item 10: a member of the callback bootstrap whose process 0
// died before listening fails as soon as it is gone (kUnavailable naming
// it), not at its timeout. Here process 0 "publishes" and dies 300 ms
// later, never listening; the member's timeout is 20 s. It stays a zombie
// (unreaped) while the member waits, as a killed parent's child would.
TEST(RendezvousFailureTest, AMemberWhoseProcessZeroDiedFailsFast) {
  const pid_t root = Spawn([] {
    absl::SleepFor(absl::Milliseconds(300));
    return true;
  });
  RootEntry ctx{absl::StrFormat("@cma-rdvf-dead-%d", getpid()), root, *MakeRendezvousToken()};
  AllGatherCallback cb = RootEntry::Gather;
  const absl::Time t0 = absl::Now();
  auto x = MakeCallbackExchange(cb, &ctx, 1, 2, absl::Seconds(20));
  const absl::Duration took = absl::Now() - t0;
  EXPECT_EQ(x.status().code(), absl::StatusCode::kUnavailable) << x.status();
  EXPECT_THAT(x.status().message(), HasSubstr(absl::StrFormat("process 0 (pid %d", root)));
  EXPECT_THAT(x.status().message(), HasSubstr("has exited"));
  EXPECT_LT(took, absl::Seconds(5));
  EXPECT_EQ(Wait(root), 0);
  // Already gone (reaped) when the member starts: at once.
  const absl::Time t1 = absl::Now();
  x = MakeCallbackExchange(cb, &ctx, 1, 2, absl::Seconds(20));
  EXPECT_EQ(x.status().code(), absl::StatusCode::kUnavailable) << x.status();
  EXPECT_LT(absl::Now() - t1, absl::Seconds(2));
}

// A member that process 0 rejects is told why: here, its index is taken.
TEST(RendezvousFailureTest, ARejectedMemberIsToldWhy) {
  const std::string path = Path("taken");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 0, 3, absl::Seconds(10), token);
    return x.ok() && (*x)->AllGather({"0", {}}).ok();
  });
  const pid_t first = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 1, 3, absl::Seconds(10), token);
    return x.ok() && (*x)->AllGather({"1", {}}).ok();
  });
  // Once member 1 is in, a second process claims index 1. It is rejected
  // at its hello, or (when its hello came before member 1's proof was
  // checked) at its proof, which its first AllGather reports.
  absl::SleepFor(absl::Milliseconds(300));
  auto x = MakeUnixSocketExchange(path, 1, 3, absl::Seconds(10), token);
  const absl::Status second = x.ok() ? (*x)->AllGather({"1 again", {}}).status() : x.status();
  EXPECT_EQ(second.code(), absl::StatusCode::kPermissionDenied) << second;
  EXPECT_THAT(second.message(), HasSubstr("process index 1 is taken"));
  EXPECT_THAT(second.message(), Not(HasSubstr("exited")));
  const pid_t last = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 2, 3, absl::Seconds(10), token);
    return x.ok() && (*x)->AllGather({"2", {}}).ok();
  });
  EXPECT_EQ(Wait(first), 0);
  EXPECT_EQ(Wait(last), 0);
  EXPECT_EQ(Wait(root), 0);
}


// Issue 19, item 11: process 0 of the callback bootstrap (the path C and
// Python use) killed in the middle of the rendezvous leaves nothing behind:
// no socket file, no directory, no bound name.
TEST(RendezvousFailureTest, AProcessZeroKilledDuringTheRendezvousLeavesNothingBehind) {
  int published[2];
  ASSERT_EQ(pipe(published), 0);
  const pid_t root = Spawn([&] {
    // Process 0 of 2: it publishes its entry and waits for a member that
    // never comes, until it is killed.
    AllGatherCallback cb = [](void* c, const void* send, size_t len, void* recv) {
      std::memset(recv, 0, 2 * len);
      std::memcpy(recv, send, len);
      const int fd = *static_cast<int*>(c);
      return write(fd, send, 108) == 108 ? 0 : 1;
    };
    return MakeCallbackExchange(cb, &published[1], 0, 2, absl::Seconds(30)).ok();
  });
  char entry[108] = {};
  ASSERT_EQ(read(published[0], entry, sizeof(entry)), 108);
  absl::SleepFor(absl::Milliseconds(100));  // listening by now
  kill(root, SIGKILL);
  EXPECT_EQ(Wait(root), 128 + SIGKILL);
  close(published[0]);
  close(published[1]);
  const std::string name(entry, strnlen(entry, sizeof(entry)));
  ASSERT_FALSE(name.empty());
  if (name[0] == '/') {  // a socket file: it and its directory must be gone
    struct stat st {};
    EXPECT_NE(stat(name.c_str(), &st), 0) << name << " left behind";
    const std::string dir = name.substr(0, name.rfind('/'));
    EXPECT_NE(stat(dir.c_str(), &st), 0) << dir << " left behind";
    unlink(name.c_str());
    rmdir(dir.c_str());
  } else {
    std::ifstream in("/proc/net/unix");
    std::string line;
    bool bound = false;
    while (std::getline(in, line)) bound = bound || absl::EndsWith(line, name);
    EXPECT_FALSE(bound) << name << " still bound";
  }
}

}  // namespace
}  // namespace cma
