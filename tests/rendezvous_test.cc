// The socket rendezvous lets no one else in: intruders of the same user
// without the token, wrong tokens, a process 0 that does not know the token,
// relayed hellos, silent connectors and floods of them, a full backlog,
// directories others can write, infinite timeouts, oversized and truncated
// frames, and a stale or foreign file at the socket path. Real processes
// (fork) on real Unix sockets.
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

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

constexpr absl::Duration kTimeout = absl::Seconds(10);

std::string Path(const char* test) { return SocketPath("rdv", test); }

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

// What a same-user intruder gets back: the number of bytes it received
// before process 0 closed on it (never a descriptor: -1 if one came).
int ReceivedBeforeClose(int c) {
  char buf[256];
  std::size_t got = 0;
  bool fds = false;
  for (;;) {
    iovec iov{buf + got, sizeof(buf) - got};
    char control[CMSG_SPACE(sizeof(int) * 4)];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(c, &m, 0);
    if (m.msg_controllen > 0) fds = true;
    if (n <= 0) break;  // closed (a reset when our unread bytes were queued there)
    got += static_cast<std::size_t>(n);
    if (got == sizeof(buf)) break;
  }
  close(c);
  return fds ? -1 : static_cast<int>(got);
}

// A connector that completes the handshake with `token`: what it gets.
absl::Status Handshake(const std::string& path, int index, const std::string& token) {
  const int c = Connect(path);
  if (c < 0) return absl::UnavailableError("no listener");
  absl::Status s = wire::MemberHandshake(c, index, token, absl::Now() + kTimeout);
  close(c);
  return s;
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
  // Same user, wrong token: claims the real member's index first.
  EXPECT_EQ(Handshake(path, 1, *MakeRendezvousToken()).code(),
            absl::StatusCode::kPermissionDenied);
  // Same user, garbage instead of a hello (a whole hello's worth): nothing back.
  int c = Connect(path);
  ASSERT_GE(c, 0);
  const std::string garbage(wire::kHelloBytes, 'G');
  ASSERT_EQ(write(c, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  EXPECT_EQ(ReceivedBeforeClose(c), 0);
  // A hello that names another process than the connector: nothing back.
  c = Connect(path);
  ASSERT_GE(c, 0);
  std::string hello(wire::kHelloBytes, '\0');
  std::uint32_t head[4] = {0x434d4148, 5, 1, static_cast<std::uint32_t>(getpid() + 1)};
  std::memcpy(hello.data(), head, sizeof(head));
  ASSERT_EQ(write(c, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
  EXPECT_EQ(ReceivedBeforeClose(c), 0);
  // A well-formed hello then a replayed or guessed proof: the challenge is
  // fresh for every connection, so the proof fails and the connector is
  // closed on with only the challenge and a verdict saying why.
  c = Connect(path);
  ASSERT_GE(c, 0);
  head[3] = static_cast<std::uint32_t>(getpid());
  std::memcpy(hello.data(), head, sizeof(head));
  std::string proof(wire::kProofBytes, '\0');
  const std::uint32_t proof_magic = 0x434d4150;
  std::memcpy(proof.data(), &proof_magic, sizeof(proof_magic));
  ASSERT_EQ(write(c, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
  char challenge[wire::kChallengeBytes];
  ASSERT_TRUE(wire::ReadAll(c, challenge, sizeof(challenge), absl::Now() + kTimeout, "0").ok());
  ASSERT_EQ(write(c, proof.data(), proof.size()), static_cast<ssize_t>(proof.size()));
  const absl::Status verdict = wire::RecvFrame(c, absl::Now() + kTimeout, "0").status();
  EXPECT_EQ(verdict.code(), absl::StatusCode::kPermissionDenied) << verdict;
  EXPECT_THAT(verdict.message(), HasSubstr("wrong token"));
  EXPECT_EQ(ReceivedBeforeClose(c), 0);
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
           absl::StrContains(x.status().message(), "rejected 1 connection(s), the last: process ") &&
           absl::StrContains(x.status().message(), "(a wrong token?)");
  });
  auto x = MakeUnixSocketExchange(path, 1, 2, kTimeout, other);
  EXPECT_EQ(x.status().code(), absl::StatusCode::kPermissionDenied) << x.status();
  EXPECT_THAT(x.status().message(), HasSubstr("or this process was given another token"));
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

// A second process 0 at the same path (another job, or a misconfigured
// rank) does not take over a live rendezvous's socket; a stale socket of a
// dead run is replaced.
TEST(RendezvousTest, ALiveSocketAtThePathIsNotTakenOverAStaleOneIs) {
  const std::string path = Path("live");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] { return Member(path, 0, token); });
  const int c = Connect(path);  // listening now
  ASSERT_GE(c, 0);
  close(c);
  auto second = MakeUnixSocketExchange(path, 0, 2, absl::Milliseconds(200), token);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  const pid_t member = Spawn([&] { return Member(path, 1, token); });
  EXPECT_EQ(Wait(member), 0);  // the first rendezvous is undisturbed
  EXPECT_EQ(Wait(root), 0);
  // A socket nobody listens on any more.
  const int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  close(stale);
  EXPECT_TRUE(MakeUnixSocketExchange(path, 0, 1, kTimeout, token).ok());
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

// Whether a socket is bound to the abstract `name` ("@..."), as the kernel
// lists them.
bool AbstractNameBound(const std::string& name) {
  std::ifstream in("/proc/net/unix");
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() >= name.size() && line.compare(line.size() - name.size(), name.size(), name) == 0) {
      return true;
    }
  }
  return false;
}

// The callback bootstrap listens under a random abstract name, bound before
// it is published: no file, no directory, nothing left once it is done.
TEST(RendezvousTest, CallbackBootstrapListensUnderAnAbstractNameAndLeavesNothing) {
  struct Ctx {
    std::string name;
    bool bound = false;
  } ctx;
  AllGatherCallback cb = [](void* c, const void* send, size_t len, void* recv) {
    auto* x = static_cast<Ctx*>(c);
    std::memcpy(recv, send, len);  // a world of one
    x->name = static_cast<const char*>(send);
    x->bound = AbstractNameBound(x->name);
    return 0;
  };
  auto x = MakeCallbackExchange(cb, &ctx, 0, 1, kTimeout);
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_THAT(ctx.name, ::testing::StartsWith("@cma-symmetric-"));
  EXPECT_TRUE(ctx.bound) << ctx.name << " was not listening when published";
  EXPECT_FALSE(AbstractNameBound(ctx.name)) << ctx.name << " left behind";
}

// ------------------------------------------------ mutual authentication

// A listener of the same user that does not know the token: it plays process
// 0's part with a random challenge and a forged welcome. The member must
// refuse it, and must not have sent it the token.
TEST(RendezvousTest, AProcessZeroThatDoesNotKnowTheTokenIsRefusedAndLearnsNothing) {
  const std::string path = Path("fake-root");
  const std::string token = *MakeRendezvousToken();
  const int l = ListenAt(path);
  ASSERT_GE(l, 0);
  const pid_t member = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 1, 2, kTimeout, token);
    return x.status().code() == absl::StatusCode::kPermissionDenied &&
           absl::StrContains(x.status().message(), "did not prove that it knows");
  });
  const int c = accept(l, nullptr, nullptr);
  ASSERT_GE(c, 0);
  std::string hello(wire::kHelloBytes, '\0');
  ASSERT_TRUE(wire::ReadAll(c, hello.data(), hello.size(), absl::Now() + kTimeout, "member").ok());
  EXPECT_EQ(hello.find(token), std::string::npos) << "the token crossed the socket";
  auto h = wire::ParseHello(hello, 2, member);
  ASSERT_TRUE(h.ok()) << h.status();
  // A challenge whose proof is made with another token.
  const std::string forged =
      wire::Challenge(*MakeRendezvousToken(), *h, std::string(wire::kNonceBytes, 'n'));
  ASSERT_EQ(write(c, forged.data(), forged.size()), static_cast<ssize_t>(forged.size()));
  // The member sends no proof of its own to a process 0 that failed to prove itself.
  EXPECT_EQ(ReceivedBeforeClose(c), 0);
  EXPECT_EQ(Wait(member), 0);
  close(l);
  unlink(path.c_str());
}

// The handshake is bound to the processes that run it: a hello from another
// pid than the socket's peer is a relay, and a proof verifies only for the
// token, the hello and the challenge it answers.
TEST(RendezvousTest, TheHandshakeIsBoundToItsPidsNoncesAndToken) {
  const std::string token = *MakeRendezvousToken();
  const std::string nonce = *wire::RandomBytes(wire::kNonceBytes);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  absl::Status member_status;
  std::thread member(
      [&] { member_status = wire::MemberHandshake(sv[0], 1, token, absl::Now() + kTimeout); });
  std::string hello(wire::kHelloBytes, '\0');
  ASSERT_TRUE(wire::ReadAll(sv[1], hello.data(), hello.size(), absl::Now() + kTimeout, "m").ok());
  auto relayed = wire::ParseHello(hello, 2, getpid() + 1);
  EXPECT_EQ(relayed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(relayed.status().message(), HasSubstr("a relay?"));
  EXPECT_THAT(wire::ParseHello(hello, 1, getpid()).status().message(), HasSubstr("bad process index"));
  auto h = wire::ParseHello(hello, 2, getpid());
  ASSERT_TRUE(h.ok()) << h.status();
  const std::string challenge = wire::Challenge(token, *h, nonce);
  ASSERT_EQ(write(sv[1], challenge.data(), challenge.size()),
            static_cast<ssize_t>(challenge.size()));
  std::string proof(wire::kProofBytes, '\0');
  ASSERT_TRUE(wire::ReadAll(sv[1], proof.data(), proof.size(), absl::Now() + kTimeout, "m").ok());
  member.join();
  EXPECT_TRUE(member_status.ok()) << member_status;
  EXPECT_TRUE(wire::CheckProof(proof, token, *h, nonce).ok());
  EXPECT_FALSE(wire::CheckProof(proof, token, *h, std::string(wire::kNonceBytes, 'x')).ok());
  EXPECT_FALSE(wire::CheckProof(proof, *MakeRendezvousToken(), *h, nonce).ok());
  wire::Hello other = *h;
  other.index = 2;
  EXPECT_FALSE(wire::CheckProof(proof, token, other, nonce).ok());
  close(sv[0]);
  close(sv[1]);
}

// ------------------------------------------------------------- slowloris

// Many silent connectors, all opened before the real member: process 0 reads
// them all at once, so the member gets in at once (serially, at 2 s each,
// twenty of them would outlast the rendezvous).
TEST(RendezvousTest, ManySilentConnectorsDoNotHoldTheRendezvousUp) {
  const std::string path = Path("slowloris");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] { return Member(path, 0, token); });
  std::vector<int> silent;
  for (int i = 0; i < 20; ++i) {
    silent.push_back(Connect(path));
    ASSERT_GE(silent.back(), 0);
  }
  const absl::Time t0 = absl::Now();
  const pid_t member = Spawn([&] { return Member(path, 1, token); });
  EXPECT_EQ(Wait(member), 0);
  EXPECT_EQ(Wait(root), 0);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(3));
  for (int c : silent) close(c);
}

// A flood beyond the cap of pending connectors: the oldest are dropped, so
// process 0 never holds more than the cap, and the member still gets in.
TEST(RendezvousTest, AFloodOfConnectorsIsCappedAndTheMemberStillGetsIn) {
  const std::string path = Path("flood");
  const std::string token = *MakeRendezvousToken();
  const pid_t root = Spawn([&] {
    auto x = MakeUnixSocketExchange(path, 0, 2, kTimeout, token);
    // The flood's FDs are all closed: only the member's socket is left open.
    int open_fds = 0;
    for (int fd = 0; fd < 1024; ++fd) open_fds += fcntl(fd, F_GETFD) != -1;
    return x.ok() && (*x)->AllGather({"member 0", {}}).ok() && open_fds < 16;
  });
  std::vector<int> flood;
  for (int i = 0; i < 150; ++i) {
    flood.push_back(Connect(path));
    ASSERT_GE(flood.back(), 0);
  }
  // The first connectors were dropped once the cap was passed.
  char b[64];
  int dropped = 0;
  for (int i = 0; i < 10; ++i) {
    ssize_t n;
    while ((n = recv(flood[i], b, sizeof(b), 0)) > 0) {
    }
    dropped += n == 0 || errno == ECONNRESET;
  }
  EXPECT_EQ(dropped, 10);
  const pid_t member = Spawn([&] { return Member(path, 1, token); });
  EXPECT_EQ(Wait(member), 0);
  EXPECT_EQ(Wait(root), 0);
  for (int c : flood) close(c);
}

// -------------------------------------------- connect, directories, timeouts

// A process 0 whose backlog is full (or a squatter that listens and never
// accepts) is a timeout for the member, not a connect that blocks forever.
TEST(RendezvousTest, AFullBacklogIsADeadlineNotAHang) {
  const std::string path = Path("backlog");
  const std::string token = *MakeRendezvousToken();
  const int l = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(l, 0), 0);
  std::vector<int> fill;
  for (int i = 0; i < 64; ++i) {
    const int c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(c);
      break;
    }
    fill.push_back(c);
  }
  const pid_t member = Spawn([&] {
    alarm(5);  // a blocking connect would hang here: the alarm makes it a failure
    const absl::Time t0 = absl::Now();
    auto x = MakeUnixSocketExchange(path, 1, 2, absl::Milliseconds(300), token);
    return x.status().code() == absl::StatusCode::kDeadlineExceeded &&
           absl::Now() - t0 < absl::Seconds(2);
  });
  EXPECT_EQ(Wait(member), 0);
  for (int c : fill) close(c);
  close(l);
  unlink(path.c_str());
}

TEST(RendezvousTest, ADirectoryOthersCanWriteIsRefused) {
  const std::string dir = absl::StrFormat("/tmp/cma-rdv-open-%d", getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);  // not sticky: anyone could swap the socket
  const std::string token = *MakeRendezvousToken();
  for (int index : {0, 1}) {
    auto x = MakeUnixSocketExchange(dir + "/s.sock", index, 2, absl::Milliseconds(300), token);
    EXPECT_EQ(x.status().code(), absl::StatusCode::kPermissionDenied) << x.status();
    EXPECT_THAT(x.status().message(), HasSubstr("writable by others"));
  }
  rmdir(dir.c_str());
}

// The callback bootstrap's members connect only to the process 0 whose pid
// the framework's all-gather published, and only under an abstract name.
TEST(RendezvousTest, TheCallbackBootstrapChecksProcessZerosPublishedPid) {
  const std::string name = absl::StrFormat("@cma-rdv-pid-%d", getpid());
  const int l = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path + 1, name.data() + 1, name.size() - 1);
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())),
            0);
  ASSERT_EQ(listen(l, 4), 0);
  RootEntry ctx{name, getpid() + 1, *MakeRendezvousToken()};  // not the listener's pid
  // Member 1 of 2: the "all-gather" hands it process 0's entry (name, token, pid).
  AllGatherCallback cb = RootEntry::Gather;
  auto x = MakeCallbackExchange(cb, &ctx, 1, 2, absl::Seconds(2));
  EXPECT_EQ(x.status().code(), absl::StatusCode::kPermissionDenied) << x.status();
  EXPECT_THAT(x.status().message(), HasSubstr("as the framework's all-gather says"));
  // A path instead of an abstract name is not what process 0 publishes.
  ctx.name = "/tmp/rendezvous.sock";
  x = MakeCallbackExchange(cb, &ctx, 1, 2, absl::Seconds(2));
  EXPECT_EQ(x.status().code(), absl::StatusCode::kInvalidArgument) << x.status();
  close(l);
}

TEST(RendezvousTest, InfiniteOrHugeTimeoutsAreRejectedClearly) {
  const std::string token = *MakeRendezvousToken();
  // Issue 19, item 12: past 2^31 ms (24.8 days) a timeout once became a
  // wait without deadline; every one past 24 h is refused, by both bootstraps.
  for (absl::Duration t : {absl::InfiniteDuration(), absl::Hours(1000), absl::Hours(25 * 24),
                           kMaxExchangeTimeout + absl::Nanoseconds(1), absl::ZeroDuration(),
                           -absl::Seconds(1)}) {
    auto x = MakeUnixSocketExchange(Path("inf"), 0, 1, t, token);
    EXPECT_EQ(x.status().code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_THAT(x.status().message(), HasSubstr("timeout must be positive and at most 24h"));
    AllGatherCallback cb = [](void*, const void* send, size_t len, void* recv) {
      std::memcpy(recv, send, len);
      return 0;
    };
    EXPECT_EQ(MakeCallbackExchange(cb, nullptr, 0, 1, t).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(MakeUnixSocketExchange(Path("day"), 0, 1, kMaxExchangeTimeout, token).ok());
}

// An infinite deadline waits without spinning (it once overflowed poll's
// timeout to zero and burned a core until the peer spoke).
TEST(RendezvousTest, AnInfiniteDeadlineWaitsWithoutSpinning) {
  for (absl::Time deadline : {absl::InfiniteFuture(), absl::Now() + absl::Hours(25 * 24)}) {
    SCOPED_TRACE(deadline);
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    std::thread late([&] {
      absl::SleepFor(absl::Milliseconds(400));
      ASSERT_EQ(write(sv[1], "x", 1), 1);
    });
    rusage before{}, after{};
    getrusage(RUSAGE_THREAD, &before);
    EXPECT_TRUE(wire::WaitFor(sv[0], POLLIN, deadline, "peer").ok());
    getrusage(RUSAGE_THREAD, &after);
    late.join();
    const double cpu = (after.ru_utime.tv_sec - before.ru_utime.tv_sec) +
                       (after.ru_stime.tv_sec - before.ru_stime.tv_sec) +
                       1e-6 * ((after.ru_utime.tv_usec - before.ru_utime.tv_usec) +
                               (after.ru_stime.tv_usec - before.ru_stime.tv_usec));
    EXPECT_LT(cpu, 0.1) << "seconds of CPU spent waiting 0.4 s";
    close(sv[0]);
    close(sv[1]);
  }
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
