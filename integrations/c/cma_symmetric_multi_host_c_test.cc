// cma_symmetric_create_multi_host on the host backend: 4 forked processes as
// 2 emulated hosts x 2 (CMA_HOST_EMULATED_HOST), a framework's all-gather
// emulated by a relay in the parent (one for every process, one for the
// leaders), as torch.distributed would provide.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integrations/c/capi_test_util.h"
#include "integrations/c/cma_c.h"
#include "nlohmann/json.hpp"

namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 4;  // hosts {0, 1} and {2, 3}; leaders 0 and 2
const char kToken[] = "3f9a1c7e5b2d8046af13c9e7b5d20864f1a3c5e7092b4d6f8e0a2c4b6d8f1e3a";
const char kOtherToken[] = "49e1b23a0ebfed79991a10a7445a7786176b7acde3e5754db8efc12991bb8627";

// Relays fixed-size all-gathers among `fds` (one socket per party, in
// party order): each sends an 8-byte length then its bytes; each gets all.
void Relay(std::vector<int> fds) {
  for (;;) {
    std::uint64_t len = 0;
    std::string all;
    for (int fd : fds) {
      std::uint64_t n = 0;
      if (read(fd, &n, sizeof(n)) != sizeof(n)) return;
      len = n;
      std::string part(n, '\0');
      std::size_t got = 0;
      while (got < n) {
        const ssize_t r = read(fd, &part[got], n - got);
        if (r <= 0) return;
        got += static_cast<std::size_t>(r);
      }
      all += part;
    }
    (void)len;
    for (int fd : fds) {
      if (write(fd, all.data(), all.size()) != static_cast<ssize_t>(all.size())) return;
    }
  }
}

struct Party {
  int fd;
  int count;
};

int RelayAllGather(void* ctx, const void* send, size_t len, void* recv) {
  const Party* p = static_cast<const Party*>(ctx);
  const std::uint64_t n = len;
  if (write(p->fd, &n, sizeof(n)) != sizeof(n)) return 1;
  if (write(p->fd, send, len) != static_cast<ssize_t>(len)) return 1;
  std::size_t got = 0, want = len * static_cast<std::size_t>(p->count);
  char* out = static_cast<char*>(recv);
  while (got < want) {
    const ssize_t r = read(p->fd, out + got, want - got);
    if (r <= 0) return 1;
    got += static_cast<std::size_t>(r);
  }
  return 0;
}

// Host ids unique to this test process (its pid, taken before any fork).
const int kTestPid = getpid();
std::string HostId(int host) {
  return "h" + std::to_string(host) + "_" + std::to_string(kTestPid % 100000);
}

// Runs body(rank, all, leaders) in 4 forked processes; their exit codes.
std::vector<int> RunHosts(const std::function<bool(int, Party*, Party*)>& body) {
  const std::string hosts[2] = {HostId(0), HostId(1)};
  int all[kWorld][2], lead[2][2];
  for (auto& p : all) EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
  for (auto& p : lead) EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
  pid_t pids[kWorld];
  for (int r = 0; r < kWorld; ++r) {
    pids[r] = fork();
    if (pids[r] != 0) continue;
    setenv("CMA_HOST_EMULATED_HOST", hosts[r / 2].c_str(), 1);
    alarm(60);
    Party a{all[r][1], kWorld};
    Party l{r % 2 == 0 ? lead[r / 2][1] : -1, 2};
    bool ok = cma_init("", "host") == 0 && body(r, &a, r % 2 == 0 ? &l : nullptr);
    _exit(ok ? 0 : 1);
  }
  for (auto& p : all) close(p[1]);
  for (auto& p : lead) close(p[1]);
  std::thread t1(Relay, std::vector<int>{all[0][0], all[1][0], all[2][0], all[3][0]});
  std::thread t2(Relay, std::vector<int>{lead[0][0], lead[1][0]});
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  t1.join();
  t2.join();
  for (auto& p : all) close(p[0]);
  for (auto& p : lead) close(p[0]);
  return codes;
}

cma_symmetric_heap* Create(int rank, Party* all, Party* leaders, const char* token) {
  const int device = 0;
  const std::string host = HostId(rank / 2);
  return cma_symmetric_create_multi_host(
      kWorld, &rank, &device, 1, rank, kWorld, host.c_str(), token, RelayAllGather, all,
      leaders != nullptr ? RelayAllGather : nullptr, leaders, 20.0, "");
}

bool Check(int rank, bool ok, const std::string& what) {
  if (!ok) std::fprintf(stderr, "rank %d: %s (last error: %s)\n", rank, what.c_str(), cma_last_error());
  return ok;
}

TEST(SymmetricMultiHostCApiTest, PeersOnTheSameHostAreMappedOthersAreNull) {
  const std::vector<int> codes = RunHosts([](int rank, Party* all, Party* leaders) {
    cma_symmetric_heap* h = Create(rank, all, leaders, kToken);
    if (!Check(rank, h != nullptr, "create")) return false;
    cma_symmetric_allocation* a = cma_symmetric_alloc(h, 4096, /*make_symmetric=*/1);
    if (!Check(rank, a != nullptr, "alloc")) return false;
    const int buddy = rank ^ 1;
    auto* mine = static_cast<std::int32_t*>(cma_symmetric_peer(a, rank));
    auto* theirs = static_cast<std::int32_t*>(cma_symmetric_peer(a, buddy));
    if (!Check(rank, mine != nullptr && theirs != nullptr, "same-host peers mapped")) return false;
    theirs[rank] = 100 + rank;
    for (int r = 0; r < kWorld; ++r) {
      if (r / 2 == rank / 2) continue;
      if (!Check(rank, cma_symmetric_peer(a, r) == nullptr && cma_symmetric_signal(a, r) == nullptr &&
                           static_cast<void**>(cma_symmetric_device_peers(a))[r] == nullptr,
                 "other host's peer null")) {
        return false;
      }
    }
    char* u = cma_symmetric_unreachable_json(a);
    if (!Check(rank, u != nullptr, "unreachable_json")) return false;
    const nlohmann::json j = nlohmann::json::parse(u);
    cma_string_free(u);
    const int other = 2 - 2 * (rank / 2);
    if (!Check(rank, j["ranks"] == nlohmann::json::array({other, other + 1}) &&
                         j["reason"].get<std::string>().find("no peer pointer") != std::string::npos,
               "unreachable: " + j.dump())) {
      return false;
    }
    if (!Check(rank, cma_symmetric_empty_cache(h) == 0, "empty_cache")) return false;  // a barrier
    if (!Check(rank, mine[buddy] == 100 + buddy, "buddy's write seen")) return false;
    if (!Check(rank, cma_symmetric_free(h, a) == 0, "free")) return false;
    // Cached and collective as usual.
    cma_symmetric_allocation* b = cma_symmetric_alloc(h, 4096, 0);
    if (!Check(rank, b != nullptr && cma_symmetric_free(h, b) == 0, "second alloc")) return false;
    cma_symmetric_destroy(h);
    cma_shutdown();
    return true;
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
}

TEST(SymmetricMultiHostCApiTest, AWrongTokenOnOneHostFailsEveryProcess) {
  const std::vector<int> codes = RunHosts([](int rank, Party* all, Party* leaders) {
    cma_symmetric_heap* h = Create(rank, all, leaders, rank / 2 == 1 ? kOtherToken : kToken);
    if (!Check(rank, h == nullptr, "create must fail")) return false;
    std::fprintf(stderr, "rank %d: %s\n", rank, cma_last_error());
    return Check(rank, std::string(cma_last_error()).find("did not prove") != std::string::npos,
                 "names the proof");
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
}

TEST(SymmetricMultiHostCApiTest, BadArgumentsFailEveryProcessTogether) {
  const std::vector<int> codes = RunHosts([](int rank, Party* all, Party* leaders) {
    // Rank 3 passes a token that breaks the token rule; the others learn it
    // at the gather instead of waiting out their timeout.
    cma_symmetric_heap* h = Create(rank, all, leaders, rank == 3 ? "1234" : kToken);
    if (!Check(rank, h == nullptr, "create must fail")) return false;
    const std::string e = cma_last_error();
    return Check(rank, rank == 3 ? e.find("token") != std::string::npos
                                 : e.find("process 3 refused its own arguments") != std::string::npos,
                 "error: " + e);
  });
  EXPECT_EQ(codes, std::vector<int>(kWorld, 0));
}

using SymmetricMultiHostCApiLocalTest = cma_test::HostCApiTest;

TEST_F(SymmetricMultiHostCApiLocalTest, RefusedAtOnce) {
  const int rank = 0, device = 0;
  EXPECT_EQ(cma_symmetric_create_multi_host(1, &rank, &device, 1, 0, 1, "h", kToken, nullptr,
                                            nullptr, nullptr, nullptr, 5, ""),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("needs an allgather callback"));
  cma_allgather_fn echo = [](void*, const void* send, size_t len, void* recv) {
    std::memcpy(recv, send, len);
    return 0;
  };
  EXPECT_EQ(cma_symmetric_create_multi_host(1, &rank, &device, 1, 2, 1, "h", kToken, echo,
                                            nullptr, nullptr, nullptr, 5, ""),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("process_index (2) < process_count (1)"));
  EXPECT_EQ(cma_symmetric_create_multi_host(1, &rank, &device, 1, 0, 1, "", kToken, echo,
                                            nullptr, nullptr, nullptr, 5, ""),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("host_id must be 1 to 64 bytes"));
  EXPECT_EQ(cma_symmetric_create_multi_host(1, &rank, &device, 1, 0, 1, "h", nullptr, echo,
                                            nullptr, nullptr, nullptr, 5, ""),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("token"));
  EXPECT_EQ(cma_symmetric_create_multi_host(1, &rank, &device, 1, 0, 1, "h", kToken, echo,
                                            nullptr, nullptr, nullptr, 1e9, ""),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("timeout must be positive"));
  EXPECT_EQ(cma_symmetric_create_multi_host(1, &rank, &device, 1, 0, 1, "h", kToken, echo,
                                            nullptr, nullptr, nullptr, 5, "colour:red"),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("bad option 'colour:red'"));
  EXPECT_EQ(cma_symmetric_unreachable_json(nullptr), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("not a live symmetric allocation"));
  // One process on one host: no leaders' callback needed; every peer mapped.
  cma_symmetric_heap* h = cma_symmetric_create_multi_host(1, &rank, &device, 1, 0, 1, "h", kToken,
                                                          echo, nullptr, nullptr, nullptr, 5, "");
  ASSERT_NE(h, nullptr) << cma_last_error();
  cma_symmetric_allocation* a = cma_symmetric_alloc(h, 4096, 0);
  ASSERT_NE(a, nullptr) << cma_last_error();
  char* u = cma_symmetric_unreachable_json(a);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(std::string(u), R"({"ranks":[],"reason":""})");
  cma_string_free(u);
  EXPECT_EQ(cma_symmetric_free(h, a), 0);
  cma_symmetric_destroy(h);
}

}  // namespace
