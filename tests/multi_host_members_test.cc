// Issue 47: across hosts, every process proves the launcher's token, not
// only the leaders. A host's own exchange may run on a token of its own
// (MakeCallbackExchange makes one per host, through the framework's store),
// so a process of another job that got into a host exchange was never
// checked against the launcher's token; with one host, no one was. Real
// processes (fork), real sockets.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
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

}  // namespace
}  // namespace cma
