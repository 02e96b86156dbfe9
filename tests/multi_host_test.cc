// Across hosts (issue 33): two emulated hosts of two processes each in one
// machine, their leaders meeting over localhost TCP (MakeMultiHostExchange),
// each process with its own host backend (HostBackendOptions::host_id,
// fabric_domain). Real processes (fork), real sockets.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/multi_host.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/symmetric_process_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 4;  // hosts: {0, 1} and {2, 3}; leaders 0 and 2
constexpr absl::Duration kHostTimeout = absl::Seconds(8);
constexpr absl::Duration kLeaderTimeout = absl::Seconds(5);

int HostOf(int rank) { return rank / 2; }
// Host ids unique to this test process (the parent's pid, taken before any
// fork), so that leftovers can be looked for.
const int kTestPid = getpid();
std::string HostId(int host) { return absl::StrFormat("h%d_%d", host, kTestPid % 1000000); }

// How each emulated host is set up.
struct Layout {
  std::string domain[2] = {"nvl0", "nvl0"};  // each host's NVLink domain ("": none)
  std::string token[2];                     // each host's token (default: Token())
  HandleType handles = HandleType::kFabric;
  bool absent[2] = {false, false};          // a host whose processes never join
};

bool Fail(int rank, const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what.c_str(), s.ToString().c_str());
  return false;
}

// Everything a member needs, built in the child (`parent` is the host
// backend's emulation of this rank's host).
struct Member {
  std::unique_ptr<HostBackend> backend;
  absl::StatusOr<std::unique_ptr<Exchange>> exchange = absl::UnknownError("not made");
};

Member Join(int rank, const Layout& layout, TcpListener& listener, int port,
            const std::string& test) {
  Member m;
  const int host = HostOf(rank);
  if (layout.absent[host]) return m;
  HostBackendOptions o;
  o.device_count = 1;
  o.fabric_handles = true;
  o.host_id = HostId(host);
  o.fabric_domain = layout.domain[host];
  m.backend = std::make_unique<HostBackend>(o);
  const std::string token = layout.token[host].empty() ? Token() : layout.token[host];
  const std::string path =
      absl::StrFormat("/tmp/cma-mh-%s-%d-host%d.sock", test, kTestPid, host);
  auto local = MakeUnixSocketExchange(path, rank % 2, 2, kHostTimeout, token);
  if (!local.ok()) {
    m.exchange = local.status();
    return m;
  }
  std::unique_ptr<ByteExchange> leaders;
  if (rank == 0) {
    auto l = MakeTcpByteExchangeRoot(std::move(listener), 2, kLeaderTimeout, token);
    if (!l.ok()) {
      m.exchange = l.status();
      return m;
    }
    leaders = std::move(*l);
  } else if (rank == 2) {
    auto l = MakeTcpByteExchange("127.0.0.1", port, 1, 2, kLeaderTimeout, token);
    if (!l.ok()) {
      m.exchange = l.status();
      return m;
    }
    leaders = std::move(*l);
  }
  m.exchange = MakeMultiHostExchange(std::move(*local), std::move(leaders), rank, kWorld, token);
  return m;
}

// Runs `body` on 4 forked members, 2 per emulated host; their exit codes.
std::vector<int> RunHosts(const Layout& layout, const char* test,
                          const std::function<bool(int, Member&)>& body) {
  Token();
  absl::StatusOr<TcpListener> listener = ListenTcp("127.0.0.1", 0);
  if (!listener.ok()) return {-1};
  const int port = listener->port();
  return RunProcesses(kWorld, [&](int rank) {
    Member m = Join(rank, layout, *listener, port, test);
    return body(rank, m);
  });
}

// Shared-memory objects of this test's emulated hosts still in /dev/shm.
std::vector<std::string> FabricLeftovers() {
  std::vector<std::string> out;
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (absl::StartsWith(name, "cma-fabric-") &&
        (absl::StrContains(name, HostId(0)) || absl::StrContains(name, HostId(1)))) {
      out.push_back(name);
    }
  }
  closedir(d);
  return out;
}

unsigned char Pattern(int rank, int round) { return static_cast<unsigned char>(0x11 * rank + 7 * round + 1); }

// Writes this rank's pattern, meets the others (a collective allocation is
// a round), then checks every peer it has a pointer to. `reachable[r]`:
// whether peers[r] must be mapped.
bool WriteAndRead(int rank, SymmetricHeap& heap, const SymmetricHandle& a, int round,
                  const std::vector<bool>& reachable) {
  std::memset(a->peers[rank], Pattern(rank, round), a->bytes);
  absl::StatusOr<SymmetricHandle> barrier = heap.Allocate(4096);
  if (!barrier.ok()) return Fail(rank, "barrier", barrier.status());
  bool ok = true;
  for (int r = 0; r < kWorld; ++r) {
    if ((a->peers[r] != nullptr) != reachable[r]) {
      std::fprintf(stderr, "rank %d: peers[%d] is %p (expected %s): %s\n", rank, r, a->peers[r],
                   reachable[r] ? "mapped" : "null", a->unreachable.c_str());
      ok = false;
      continue;
    }
    if (a->peers[r] == nullptr) continue;
    const auto* p = static_cast<const unsigned char*>(a->peers[r]);
    for (std::size_t i : {std::size_t{0}, a->bytes / 2, a->bytes - 1}) {
      if (p[i] != Pattern(r, round)) {
        std::fprintf(stderr, "rank %d: peer %d byte %zu is %d, expected %d\n", rank, r, i, p[i],
                     Pattern(r, round));
        ok = false;
      }
    }
  }
  return heap.Free(*barrier).ok() && ok;
}

bool NothingLeft(int rank, HostBackend& b) {
  const HostResourceCounts c = b.LiveResources();
  if (c.physical_handles != 0 || c.mappings != 0 || c.reservations != 0 ||
      c.managed_allocations != 0) {
    std::fprintf(stderr, "rank %d: leaked: %d handles, %d mappings, %d reservations, %d managed\n",
                 rank, c.physical_handles, c.mappings, c.reservations, c.managed_allocations);
    return false;
  }
  return true;
}

// The whole life of a symmetric allocation across two hosts: allocate,
// write, read every peer it maps, free, reuse from the cache, free, empty.
bool Lifecycle(int rank, Member& m, const Layout& layout, const std::vector<bool>& reachable) {
  if (!m.exchange.ok()) return Fail(rank, "exchange", m.exchange.status());
  if ((*m.exchange)->host_count() != 2 || (*m.exchange)->host_of(rank) != HostOf(rank)) {
    std::fprintf(stderr, "rank %d: wrong topology\n", rank);
    return false;
  }
  SymmetricOptions opts;
  opts.handle_type = layout.handles;
  {
    auto heap = SymmetricHeap::Create(*m.backend, {kWorld, {rank}, {0}}, std::move(*m.exchange),
                                      opts);
    if (!heap.ok()) return Fail(rank, "create", heap.status());
    absl::StatusOr<SymmetricHandle> a = (*heap)->Allocate(1 << 20);
    if (!a.ok()) return Fail(rank, "allocate", a.status());
    const std::uint64_t id = (*a)->id;
    const bool all = std::find(reachable.begin(), reachable.end(), false) == reachable.end();
    if ((*a)->unreachable.empty() != all) {
      std::fprintf(stderr, "rank %d: unreachable says '%s'\n", rank, (*a)->unreachable.c_str());
      return false;
    }
    if (!WriteAndRead(rank, **heap, *a, 1, reachable)) return false;
    if (absl::Status s = (*heap)->Free(*a); !s.ok()) return Fail(rank, "free", s);
    // Cached: the same allocation comes back, with no driver call.
    const std::int64_t creates = m.backend->CallCount("VmmCreate");
    absl::StatusOr<SymmetricHandle> b = (*heap)->Allocate(1 << 20);
    if (!b.ok()) return Fail(rank, "reallocate", b.status());
    if ((*b)->id != id || m.backend->CallCount("VmmCreate") != creates ||
        (*heap)->GetStats().cache_hits < 1) {
      std::fprintf(stderr, "rank %d: not a cache hit\n", rank);
      return false;
    }
    if (!WriteAndRead(rank, **heap, *b, 2, reachable)) return false;
    if (absl::Status s = (*heap)->Free(*b); !s.ok()) return Fail(rank, "free again", s);
    if (absl::Status s = (*heap)->EmptyCache(); !s.ok()) return Fail(rank, "empty cache", s);
  }
  return NothingLeft(rank, *m.backend);
}

TEST(MultiHostTest, TwoHostsInOneNvlinkDomainMapEveryPeer) {
  const Layout layout;
  const std::vector<bool> all(kWorld, true);
  const std::vector<int> codes = RunHosts(layout, "one-domain", [&](int rank, Member& m) {
    return Lifecycle(rank, m, layout, all);
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
  EXPECT_THAT(FabricLeftovers(), ::testing::IsEmpty());
}

// Hosts in different NVLink domains, or a heap of POSIX FDs: each member
// maps its own host's members only; the others' pointers are null, and the
// allocation says why. Not an error, not a hang.
TEST(MultiHostTest, MembersOutsideEveryDomainGetNullPeers) {
  for (const bool fds : {false, true}) {
    Layout layout;
    layout.domain[1] = "nvl1";
    if (fds) layout.handles = HandleType::kPosixFd;
    const std::vector<int> codes =
        RunHosts(layout, fds ? "fds" : "two-domains", [&](int rank, Member& m) {
          std::vector<bool> reachable(kWorld);
          for (int r = 0; r < kWorld; ++r) reachable[r] = HostOf(r) == HostOf(rank);
          return Lifecycle(rank, m, layout, reachable);
        });
    EXPECT_EQ(codes, std::vector<int>(kWorld, 0)) << (fds ? "POSIX FDs" : "two domains");
  }
  EXPECT_THAT(FabricLeftovers(), ::testing::IsEmpty());
}

// The reason, as a member reads it.
TEST(MultiHostTest, TheReasonForANullPeerNamesTheDomains) {
  Layout layout;
  layout.domain[1] = "nvl1";
  const std::vector<int> codes = RunHosts(layout, "reason", [&](int rank, Member& m) {
    if (!m.exchange.ok()) return Fail(rank, "exchange", m.exchange.status());
    SymmetricOptions opts;
    opts.handle_type = HandleType::kFabric;
    auto heap = SymmetricHeap::Create(*m.backend, {kWorld, {rank}, {0}}, std::move(*m.exchange),
                                      opts);
    if (!heap.ok()) return Fail(rank, "create", heap.status());
    absl::StatusOr<SymmetricHandle> a = (*heap)->Allocate(1 << 16);
    if (!a.ok()) return Fail(rank, "allocate", a.status());
    const std::string& why = (*a)->unreachable;
    const std::string other = rank < 2 ? "NVLink domain 'nvl1'" : "NVLink domain 'nvl0'";
    const int first_other = rank < 2 ? 2 : 0;
    const bool ok = absl::StrContains(why, other) &&
                    absl::StrContains(why, absl::StrFormat("member %d ", first_other)) &&
                    (*a)->signals[first_other] == nullptr &&
                    static_cast<void**>((*a)->device_peers)[first_other] == nullptr;
    if (!ok) std::fprintf(stderr, "rank %d: %s\n", rank, why.c_str());
    return ok && (*heap)->Free(*a).ok();
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
}

// Host 1 has another token (its own processes agree with each other): its
// leader cannot answer leader 0's TCP challenge, so it never takes a slot.
// It hears at once that leader 0 closed on it; leader 0 times out naming
// the turned-away connection; every process fails, none hangs. (The
// leaders' own proof, which refuses a wrong token over any ByteExchange, is
// tested in multi_host_auth_test.)
TEST(MultiHostTest, AWrongTokenOnOneHostFailsEveryone) {
  Layout layout;
  layout.token[1] = *MakeRendezvousToken();
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunHosts(layout, "wrong-token", [&](int rank, Member& m) {
    const absl::Status s = m.exchange.status();
    bool ok = !s.ok();
    if (rank == 0) {
      ok = s.code() == absl::StatusCode::kDeadlineExceeded &&
           absl::StrContains(s.message(), "never came: leader 1; 1 connection(s) turned away");
    } else if (rank == 2) {
      ok = s.code() == absl::StatusCode::kUnavailable &&
           absl::StrContains(s.message(), "closed the connection before acknowledging");
    }
    if (!ok) std::fprintf(stderr, "rank %d got: %s\n", rank, s.ToString().c_str());
    return ok;
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
  EXPECT_LT(absl::Now() - start, kHostTimeout) << "failed at the leaders' timeout, no hang";
}

int ConnectTo(int port) {
  const int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(c);
    return -1;
  }
  return c;
}

// Connections that say nothing (no token needed to open one) do not starve
// leader 0: it serves every connector's hello at once, each within its own
// deadline, so the real leader 1 gets in long before the silent ones expire.
TEST(MultiHostTest, SilentConnectionsDoNotStarveTheRoot) {
  const std::string token = Token();
  TcpListener l = *ListenTcp("127.0.0.1", 0);
  const int port = l.port();
  std::vector<int> silent;
  for (int k = 0; k < 5; ++k) silent.push_back(ConnectTo(port));
  absl::StatusOr<std::unique_ptr<ByteExchange>> root, member;
  const absl::Time start = absl::Now();
  std::thread t([&] { root = MakeTcpByteExchangeRoot(std::move(l), 2, absl::Seconds(6), token); });
  member = MakeTcpByteExchange("127.0.0.1", port, 1, 2, absl::Seconds(6), token);
  t.join();
  for (int fd : silent) close(fd);
  EXPECT_TRUE(root.ok()) << root.status();
  EXPECT_TRUE(member.ok()) << member.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "waited out a silent connection";
}

// A slot goes only to a connector that answers the token's challenge: a
// squatter's hello (the right form, no MAC) does not take leader 1's slot,
// and one with another token is turned away; the real leader 1 gets in.
TEST(MultiHostTest, OnlyATokenHolderTakesASlot) {
  const std::string token = Token();
  TcpListener l = *ListenTcp("127.0.0.1", 0);
  const int port = l.port();
  const int squat = ConnectTo(port);
  const std::uint32_t hello[4] = {0x434d4154, 3, 1, 2};
  ASSERT_EQ(write(squat, hello, sizeof(hello)), static_cast<ssize_t>(sizeof(hello)));
  absl::StatusOr<std::unique_ptr<ByteExchange>> root;
  std::thread t([&] { root = MakeTcpByteExchangeRoot(std::move(l), 2, absl::Seconds(5), token); });
  absl::SleepFor(absl::Milliseconds(200));
  auto other = MakeTcpByteExchange("127.0.0.1", port, 1, 2, absl::Seconds(5),
                                   *MakeRendezvousToken());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kUnavailable) << other.status();
  auto member = MakeTcpByteExchange("127.0.0.1", port, 1, 2, absl::Seconds(5), token);
  t.join();
  close(squat);
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(member.ok()) << member.status();
  // And the exchange works.
  std::thread r([&] { EXPECT_TRUE((*root)->AllGather("zero").ok()); });
  absl::StatusOr<std::vector<std::string>> got = (*member)->AllGather("one");
  r.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (std::vector<std::string>{"zero", "one"}));
}

// A listener's next connection (blocking), or -1 after `wait`.
int AcceptWithin(int listener, absl::Duration wait) {
  pollfd p{listener, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) != 1) return -1;
  return accept(listener, nullptr, nullptr);  // blocking: O_NONBLOCK is not inherited
}

// What arrived on `fd` within `wait` (at most `limit` bytes).
std::string ReadFor(int fd, std::size_t limit, absl::Duration wait) {
  std::string got;
  const absl::Time by = absl::Now() + wait;
  while (got.size() < limit && absl::Now() < by) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 20) != 1) continue;
    char buf[256];
    const ssize_t n = read(fd, buf, std::min(sizeof(buf), limit - got.size()));
    if (n <= 0) break;
    got.append(buf, n);
  }
  return got;
}

// A fake leader 0 replays a real ack: it records a whole hello between the
// real leader 0 and leader 1 (relaying every byte), then offers leader 1,
// in a new session, the same challenge (the same root nonce) and replays
// the recorded ack. The ack names leader 1's own fresh nonce, which differs
// now: leader 1 refuses it at once (it never takes the fake for leader 0).
TEST(MultiHostTest, AReplayedAckIsRefused) {
  const std::string token = Token();
  TcpListener real = *ListenTcp("127.0.0.1", 0);
  TcpListener relay = *ListenTcp("127.0.0.1", 0);
  const int real_port = real.port(), relay_port = relay.port();
  const int relay_fd = relay.release();
  std::atomic<int> done{0};
  absl::StatusOr<std::unique_ptr<ByteExchange>> root, member;
  std::thread t([&] {
    root = MakeTcpByteExchangeRoot(std::move(real), 2, absl::Seconds(5), token);
    ++done;
  });
  std::thread u([&] {
    member = MakeTcpByteExchange("127.0.0.1", relay_port, 1, 2, absl::Seconds(5), token);
    ++done;
  });
  const int to_member = AcceptWithin(relay_fd, absl::Seconds(5));
  const int to_root = ConnectTo(real_port);
  std::string from_root, from_member;  // every byte, as relayed
  const absl::Time by = absl::Now() + absl::Seconds(5);
  while (done.load() < 2 && absl::Now() < by) {
    pollfd p[2] = {{to_root, POLLIN, 0}, {to_member, POLLIN, 0}};
    if (poll(p, 2, 20) <= 0) continue;
    char buf[256];
    for (int k = 0; k < 2; ++k) {
      if ((p[k].revents & POLLIN) == 0) continue;
      const ssize_t n = read(p[k].fd, buf, sizeof(buf));
      if (n <= 0) continue;
      (k == 0 ? from_root : from_member).append(buf, n);
      EXPECT_EQ(write(p[1 - k].fd, buf, n), n);
    }
  }
  t.join();
  u.join();
  ASSERT_GE(to_member, 0);
  ASSERT_GE(to_root, 0);
  close(to_root);
  close(to_member);
  ASSERT_TRUE(root.ok()) << root.status();
  ASSERT_TRUE(member.ok()) << member.status();
  constexpr std::size_t kChallenge = 8 + 16;  // magic, version, root nonce
  ASSERT_GT(from_root.size(), kChallenge);
  root->reset();
  member->reset();

  // A new session: the fake leader 0 offers the recorded challenge, reads
  // leader 1's hello, and replays the recorded ack.
  const absl::Time start = absl::Now();
  std::thread v([&] {
    member = MakeTcpByteExchange("127.0.0.1", relay_port, 1, 2, absl::Seconds(5), token);
  });
  const int fake = AcceptWithin(relay_fd, absl::Seconds(5));
  if (fake >= 0) {
    EXPECT_EQ(write(fake, from_root.data(), kChallenge), static_cast<ssize_t>(kChallenge));
    const std::string hello = ReadFor(fake, from_member.size(), absl::Seconds(3));
    EXPECT_EQ(hello.size(), from_member.size());
    EXPECT_NE(hello, from_member) << "leader 1's hello names a fresh nonce of its own";
    const std::string ack = from_root.substr(kChallenge);
    EXPECT_EQ(write(fake, ack.data(), ack.size()), static_cast<ssize_t>(ack.size()));
  }
  v.join();
  ASSERT_GE(fake, 0);
  close(fake);
  close(relay_fd);
  EXPECT_EQ(member.status().code(), absl::StatusCode::kPermissionDenied) << member.status();
  EXPECT_THAT(member.status().message(), HasSubstr("did not prove"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << "refused at once, not at the timeout";
}

// A host whose leader never joins: the other host fails at the leaders'
// timeout, naming it (no hang); so does the host whose leader is gone.
TEST(MultiHostTest, AMissingHostIsATimeoutNamingIt) {
  Layout layout;
  layout.absent[1] = true;
  const absl::Time start = absl::Now();
  const std::vector<int> codes = RunHosts(layout, "missing", [&](int rank, Member& m) {
    if (rank >= 2) return true;  // host 1 never comes
    // The leader times out naming leader 1; its member hears that its
    // leader is gone (or its reason) rather than waiting out its own timeout.
    const absl::Status s = m.exchange.status();
    const bool ok = rank == 0 ? s.code() == absl::StatusCode::kDeadlineExceeded &&
                                    absl::StrContains(s.message(), "never came: leader 1")
                              : !s.ok();
    if (!ok) std::fprintf(stderr, "rank %d got: %s\n", rank, s.ToString().c_str());
    return ok;
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
  EXPECT_LT(absl::Now() - start, kHostTimeout);
}

// Bad input is refused, naming the problem, before anything is sent.
TEST(MultiHostTest, BadInputIsRefused) {
  const std::string token = Token();
  auto bad = MakeMultiHostExchange(nullptr, nullptr, 0, 2, token);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  bad = MakeMultiHostExchange(MakeSingleProcessExchange(), nullptr, 3, 2, token);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("process 3 of 2"));
  bad = MakeMultiHostExchange(MakeSingleProcessExchange(), nullptr, 0, 2, "0123456789abcdef");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("128 bits"));
  // Process 0 of its host is the leader: it needs the leaders' exchange.
  bad = MakeMultiHostExchange(MakeSingleProcessExchange(), nullptr, 0, 2, token);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("needs a leaders' exchange"));

  EXPECT_EQ(ListenTcp("localhost", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ListenTcp("127.0.0.1", 70000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeTcpByteExchange("127.0.0.1", 1, 0, 2, kLeaderTimeout, token).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeTcpByteExchange("127.0.0.1", 1, 2, 2, kLeaderTimeout, token).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeTcpByteExchange("127.0.0.1", 1, 1, 2, absl::InfiniteDuration(), token).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeCallbackByteExchange(nullptr, nullptr, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Nothing listens: a timeout naming the address, not a hang.
  absl::StatusOr<TcpListener> l = ListenTcp("127.0.0.1", 0);
  ASSERT_TRUE(l.ok()) << l.status();
  const int port = l->port();
  *l = TcpListener();  // closed
  auto none = MakeTcpByteExchange("127.0.0.1", port, 1, 2, absl::Milliseconds(300), token);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(none.status().message(), HasSubstr(absl::StrFormat("127.0.0.1:%d", port)));
}

// Bad requests to a multi-host heap fail on every member with a clear
// error and change nothing: the next collective works.
TEST(MultiHostTest, BadRequestsChangeNothing) {
  Layout layout;
  const std::vector<int> codes = RunHosts(layout, "bad-requests", [&](int rank, Member& m) {
    if (!m.exchange.ok()) return Fail(rank, "exchange", m.exchange.status());
    SymmetricOptions opts;
    opts.handle_type = HandleType::kFabric;
    {
      auto heap = SymmetricHeap::Create(*m.backend, {kWorld, {rank}, {0}},
                                        std::move(*m.exchange), opts);
      if (!heap.ok()) return Fail(rank, "create", heap.status());
      // Rank 3 asks for 0 bytes: everyone fails, naming process 3.
      absl::StatusOr<SymmetricHandle> zero = (*heap)->Allocate(rank == 3 ? 0 : 4096);
      const bool named = rank == 3 ? absl::StrContains(zero.status().message(), "0 bytes")
                                   : absl::StrContains(zero.status().message(), "process 3");
      if (zero.ok() || !named) return Fail(rank, "zero bytes", zero.status());
      // Sizes that differ: everyone fails.
      absl::StatusOr<SymmetricHandle> mixed = (*heap)->Allocate(rank == 1 ? 8192 : 4096);
      if (mixed.status().code() != absl::StatusCode::kInvalidArgument) {
        return Fail(rank, "mixed sizes", mixed.status());
      }
      // A handle this heap never handed out.
      SymmetricAllocation fake;
      if ((*heap)->Free({&fake, 1}).code() != absl::StatusCode::kInvalidArgument) {
        return Fail(rank, "bogus free", absl::UnknownError("accepted"));
      }
      if ((*heap)->GetStats().allocations != 0 || !(*heap)->Snapshot().empty()) {
        return Fail(rank, "state", absl::UnknownError("changed"));
      }
      absl::StatusOr<SymmetricHandle> good = (*heap)->Allocate(4096);
      if (!good.ok()) return Fail(rank, "allocate after", good.status());
      if (absl::Status s = (*heap)->Free(*good); !s.ok()) return Fail(rank, "free", s);
    }
    return NothingLeft(rank, *m.backend);
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
  EXPECT_THAT(FabricLeftovers(), ::testing::IsEmpty());
}

}  // namespace
}  // namespace cma
