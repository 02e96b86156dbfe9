// The socket rendezvous lets no one else in: intruders of the same user
// without the token, wrong tokens, silent connectors, oversized and truncated
// frames, and a stale or foreign file at the socket path. Real processes
// (fork) on real Unix sockets.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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

namespace cma {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Seconds(10);

std::string Path(const char* test) {
  return absl::StrFormat("/tmp/cma-rdv-%s-%d.sock", test, getpid());
}

pid_t Spawn(const std::function<bool()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body() ? 0 : 1);
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A connection to `path` once something listens there.
int Connect(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  for (int i = 0; i < 2000; ++i) {
    const int c = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return c;
    close(c);
    usleep(2000);
  }
  return -1;
}

// What an intruder gets back: true when the connection is closed on it
// without one byte or descriptor sent.
bool ClosedUnanswered(int c) {
  char buf[64];
  const ssize_t n = recv(c, buf, sizeof(buf), 0);
  const int err = errno;
  close(c);
  // Closed with our unread bytes still queued there reads as a reset.
  return n == 0 || (n < 0 && err == ECONNRESET);
}

// Members 0 and 1 of a two-process rendezvous: each exchanges one round and
// checks it saw the other's bytes.
bool Member(const std::string& path, int index, const std::string& token) {
  auto x = MakeUnixSocketExchange(path, index, 2, kTimeout, token);
  if (!x.ok()) return false;
  auto all = (*x)->AllGather({absl::StrFormat("member %d", index), {}});
  return all.ok() && all->size() == 2 && (*all)[0].bytes == "member 0" &&
         (*all)[1].bytes == "member 1";
}

TEST(RendezvousTest, IntrudersAreTurnedAwayAndTheRendezvousCompletes) {
  const std::string path = Path("intruders");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] { return Member(path, 0, token); });
  // Same user, no token: claims the real member's index first.
  int c = Connect(path);
  ASSERT_GE(c, 0);
  ASSERT_TRUE(wire::SendHello(c, 1, std::string(64, 'x'), absl::Now() + kTimeout).ok());
  EXPECT_TRUE(ClosedUnanswered(c));
  // Same user, garbage instead of a hello.
  c = Connect(path);
  ASSERT_GE(c, 0);
  ASSERT_EQ(write(c, "GET / HTTP/1.0\r\n\r\n", 18), 18);
  EXPECT_TRUE(ClosedUnanswered(c));
  // A hello announcing a huge token is refused before it is read.
  c = Connect(path);
  ASSERT_GE(c, 0);
  const std::uint32_t huge[4] = {0x434d4148, 2, 1, 0xffffffffu};
  ASSERT_EQ(write(c, huge, sizeof(huge)), static_cast<ssize_t>(sizeof(huge)));
  EXPECT_TRUE(ClosedUnanswered(c));
  // The real member still gets in.
  const pid_t member = Spawn([&] { return Member(path, 1, token); });
  EXPECT_EQ(Wait(member), 0);
  EXPECT_EQ(Wait(root), 0);
}

TEST(RendezvousTest, ASilentConnectorDoesNotHoldTheRendezvousUp) {
  const std::string path = Path("silent");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] { return Member(path, 0, token); });
  const int silent = Connect(path);  // connects, says nothing, stays open
  ASSERT_GE(silent, 0);
  const absl::Time t0 = absl::Now();
  const pid_t member = Spawn([&] { return Member(path, 1, token); });
  EXPECT_EQ(Wait(member), 0);
  EXPECT_EQ(Wait(root), 0);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(8));
  close(silent);
}

TEST(RendezvousTest, AWrongTokenIsPermissionDeniedAndNamedByProcessZero) {
  const std::string path = Path("wrong");
  const std::string token = *MakeRendezvousToken();
  const std::string other = *MakeRendezvousToken();
  ASSERT_NE(token, other);
  const pid_t root = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 0, 2, absl::Milliseconds(1500), token);
    return !x.ok() && x.status().code() == absl::StatusCode::kDeadlineExceeded &&
           absl::StrContains(x.status().message(), "rejected 1 connection(s), the last: wrong token");
  });
  auto x = MakeUnixSocketExchange(path, 1, 2, kTimeout, other);
  EXPECT_EQ(x.status().code(), absl::StatusCode::kPermissionDenied) << x.status();
  EXPECT_THAT(x.status().message(), HasSubstr("rejected this process"));
  EXPECT_EQ(Wait(root), 0);
}

TEST(RendezvousTest, TokensAndPathsAreChecked) {
  EXPECT_EQ(MakeUnixSocketExchange(Path("t"), 0, 1, kTimeout, "short").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeUnixSocketExchange(Path("t"), 0, 1, kTimeout, std::string(200, 'a'))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const std::string token = *MakeRendezvousToken();
  EXPECT_EQ(token.size(), 64u);
  EXPECT_NE(token, *MakeRendezvousToken());
  // A regular file at the path is never removed.
  const std::string file = Path("file");
  std::ofstream(file) << "precious";
  auto x = MakeUnixSocketExchange(file, 0, 2, absl::Milliseconds(100), token);
  EXPECT_EQ(x.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(x.status().message(), HasSubstr("not a socket"));
  struct stat st {};
  EXPECT_EQ(stat(file.c_str(), &st), 0);
  unlink(file.c_str());
}

TEST(RendezvousTest, TheSocketIsOwnerOnlyWhileListening) {
  const std::string path = Path("mode");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] { return Member(path, 0, token); });
  const int c = Connect(path);  // listening now
  ASSERT_GE(c, 0);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  close(c);
  const pid_t member = Spawn([&] { return Member(path, 1, token); });
  EXPECT_EQ(Wait(member), 0);
  EXPECT_EQ(Wait(root), 0);
  EXPECT_NE(stat(path.c_str(), &st), 0);  // removed once everyone is in
}

TEST(RendezvousTest, CallbackBootstrapUsesAPrivateDirectoryAndRemovesIt) {
  struct Ctx {
    std::string dir;
    mode_t mode = 0;
  } ctx;
  AllGatherCallback cb = [](void* c, const void* send, size_t len, void* recv) {
    auto* x = static_cast<Ctx*>(c);
    std::memcpy(recv, send, len);  // a world of one
    std::string path(static_cast<const char*>(send));
    x->dir = path.substr(0, path.rfind('/'));
    struct stat st {};
    if (stat(x->dir.c_str(), &st) == 0) x->mode = st.st_mode & 0777;
    return 0;
  };
  auto x = MakeCallbackExchange(cb, &ctx, 0, 1, kTimeout);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(ctx.mode, 0700u) << ctx.dir;
  struct stat st {};
  EXPECT_NE(stat(ctx.dir.c_str(), &st), 0) << ctx.dir << " left behind";
}

// ---------------------------------------------------------------- frames

class FrameTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }
  void Send(const void* p, std::size_t n) {
    ASSERT_EQ(write(fds_[1], p, n), static_cast<ssize_t>(n));
  }
  void Hangup() {
    close(fds_[1]);
    fds_[1] = -1;
  }
  absl::StatusOr<Contribution> Receive() {
    return wire::RecvFrame(fds_[0], absl::Now() + absl::Seconds(2), "process 1");
  }
  int fds_[2] = {-1, -1};
};

TEST_F(FrameTest, AnOversizedFrameIsRefusedBeforeAllocation) {
  const std::uint32_t h[4] = {0x434d4158, 1, 0xffffffffu, 0};  // 4 GiB announced
  Send(h, sizeof(h));
  auto c = Receive();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(c.status().message(), HasSubstr("limits"));
}

TEST_F(FrameTest, ATruncatedFrameIsADisconnectNamingThePeer) {
  const std::uint32_t h[4] = {0x434d4158, 1, 100, 0};
  Send(h, sizeof(h));
  Send("only ten b", 10);
  Hangup();
  auto c = Receive();
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(c.status().message(), HasSubstr("process 1 disconnected"));
}

TEST_F(FrameTest, AWellFormedFrameRoundTrips) {
  ASSERT_TRUE(wire::SendFrame(fds_[1], true, {"payload", {}}, absl::Now() + absl::Seconds(2),
                              "process 0")
                  .ok());
  auto c = Receive();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bytes, "payload");
}

}  // namespace
}  // namespace cma
