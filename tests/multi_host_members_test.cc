// Issue 47: across hosts, every process proves the launcher's token, not
// only the leaders. A host's own exchange may run on a token of its own
// (MakeCallbackExchange makes one per host, through the framework's store),
// so a process of another job that got into a host exchange was never
// checked against the launcher's token; with one host, no one was. Real
// processes (fork), real sockets.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/multi_host.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/symmetric_process_util.h"

namespace cma {
namespace {

constexpr absl::Duration kHostTimeout = absl::Seconds(8);
constexpr absl::Duration kLeaderTimeout = absl::Seconds(5);

// The launcher's token of every process but one, and another job's.
const std::string& Launcher() {
  static const std::string* t = new std::string(*MakeRendezvousToken());
  return *t;
}
const std::string& Stranger() {
  static const std::string* t = new std::string(*MakeRendezvousToken());
  return *t;
}

// A leaders' exchange of one party (a single host).
int SoloGather(void*, const void* send, size_t len, void* recv) {
  std::memcpy(recv, send, len);
  return 0;
}

bool Report(int rank, const absl::Status& s, bool ok) {
  if (!ok) std::fprintf(stderr, "rank %d got: %s\n", rank, s.ToString().c_str());
  return ok;
}

// Two hosts of two processes over TCP; each host's exchange runs on that
// host's own token (as MakeCallbackExchange's would), and process 1 (not a
// leader) passes another job's launcher token. Every process fails, at
// once: process 1's host names it, the other host hears its leader refuse.
TEST(MultiHostMembersTest, ANonLeaderWithAnotherTokenFailsEveryHost) {
  Launcher();
  Stranger();
  const std::string host_token[2] = {*MakeRendezvousToken(), *MakeRendezvousToken()};
  absl::StatusOr<TcpListener> listener = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = listener->port();
  const int pid = getpid();
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunProcesses(4, [&](int rank) {
    const int host = rank / 2;
    const std::string path = absl::StrFormat("/tmp/cma-mhm-%d-host%d.sock", pid, host);
    auto local = MakeUnixSocketExchange(path, rank % 2, 2, kHostTimeout, host_token[host]);
    if (!local.ok()) return Report(rank, local.status(), false);
    std::unique_ptr<ByteExchange> leaders;
    if (rank == 0) {
      auto l = MakeTcpByteExchangeRoot(std::move(*listener), 2, kLeaderTimeout, Launcher());
      if (!l.ok()) return Report(rank, l.status(), false);
      leaders = std::move(*l);
    } else if (rank == 2) {
      auto l = MakeTcpByteExchange("127.0.0.1", port, 1, 2, kLeaderTimeout, Launcher());
      if (!l.ok()) return Report(rank, l.status(), false);
      leaders = std::move(*l);
    }
    auto x = MakeMultiHostExchange(std::move(*local), std::move(leaders), rank, 4,
                                   rank == 1 ? Stranger() : Launcher());
    const absl::Status s = x.status();
    if (rank == 0) {
      return Report(rank, s,
                    s.code() == absl::StatusCode::kPermissionDenied &&
                        absl::StrContains(s.message(), "process 1 of this host did not prove"));
    }
    if (rank == 1) {
      return Report(rank, s,
                    s.code() == absl::StatusCode::kPermissionDenied &&
                        absl::StrContains(s.message(), "process 0 of this host did not prove"));
    }
    return Report(rank, s, !s.ok() && absl::StrContains(s.message(), "refused"));
  });
  EXPECT_EQ(codes, std::vector<int>(4, 0));
  EXPECT_LT(absl::Now() - start, kHostTimeout) << "failed at once, not at a timeout";
}

// One host (the C API's case with a single host id): there is no other
// leader to prove anything to, and the launcher's token was never checked.
TEST(MultiHostMembersTest, OnOneHostEveryProcessProvesTheLaunchersToken) {
  for (const bool stranger : {false, true}) {
    const std::string path = SocketPath(stranger ? "one-host-stranger" : "one-host");
    Launcher();
    Stranger();
    const std::vector<int> codes = RunProcesses(3, [&](int rank) {
      auto local = MakeUnixSocketExchange(path, rank, 3, kHostTimeout, Token());
      if (!local.ok()) return Report(rank, local.status(), false);
      std::unique_ptr<ByteExchange> leaders;
      if (rank == 0) leaders = *MakeCallbackByteExchange(&SoloGather, nullptr, 0, 1);
      auto x = MakeMultiHostExchange(std::move(*local), std::move(leaders), rank, 3,
                                     stranger && rank == 2 ? Stranger() : Launcher());
      if (!stranger) return Report(rank, x.status(), x.ok() && (*x)->host_count() == 1);
      return Report(rank, x.status(),
                    x.status().code() == absl::StatusCode::kPermissionDenied &&
                        absl::StrContains(x.status().message(),
                                          rank == 2 ? "processes 0, 1 of this host"
                                                    : "process 2 of this host"));
    });
    EXPECT_EQ(codes, std::vector<int>(3, 0)) << (stranger ? "a stranger" : "one token");
  }
}

// A non-blocking connection to 127.0.0.1:port that says nothing, or -1.
int Silent(int port) {
  const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    close(c);
    return -1;
  }
  return c;
}

// An unauthenticated flood of connections on leader 0's port (no token is
// needed to open one): 300 held open before leader 1 comes, and more opened
// while it joins. Leader 1 still gets in well within the timeout: leader 0
// accepts everything waiting, challenges at once, drops the oldest silent
// connection when full (telling it it was busy), and a connector dropped
// before its hello was judged tries again. Before, 64 pending slots of 2 s
// each, a backlog of 64 and one connect attempt kept it out for the flood's
// whole length.
TEST(MultiHostFloodTest, AFloodOfConnectionsDoesNotKeepALeaderOut) {
  const std::string token = Launcher();
  TcpListener l = *ListenTcp("127.0.0.1", 0);
  const int port = l.port();
  constexpr absl::Duration kTimeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<ByteExchange>> root;
  std::thread t([&] { root = MakeTcpByteExchangeRoot(std::move(l), 2, kTimeout, token); });
  std::vector<int> flood;
  for (int k = 0; k < 300; ++k) {
    const int c = Silent(port);
    if (c >= 0) flood.push_back(c);
  }
  std::atomic<bool> joined{false};
  std::thread more([&] {  // the flood goes on while leader 1 joins
    std::vector<int> extra;
    while (!joined.load() && extra.size() < 2000) {
      const int c = Silent(port);
      if (c >= 0) extra.push_back(c);
      if (extra.size() > 300) {
        close(extra.front());
        extra.erase(extra.begin());
      }
      absl::SleepFor(absl::Microseconds(200));
    }
    for (int c : extra) close(c);
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<ByteExchange>> member =
      MakeTcpByteExchange("127.0.0.1", port, 1, 2, kTimeout, token);
  const absl::Duration took = absl::Now() - start;
  joined = true;
  more.join();
  t.join();
  for (int c : flood) close(c);
  RecordProperty("flood_connections", static_cast<int>(flood.size()));
  RecordProperty("join_ms", static_cast<int>(absl::ToInt64Milliseconds(took)));
  ASSERT_TRUE(member.ok()) << member.status();
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_LT(took, absl::Seconds(3)) << "kept out by the flood";
  // And the exchange works.
  std::thread r([&] { EXPECT_TRUE((*root)->AllGather("zero").ok()); });
  absl::StatusOr<std::vector<std::string>> got = (*member)->AllGather("one");
  r.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"zero", "one"}));
}

}  // namespace
}  // namespace cma
