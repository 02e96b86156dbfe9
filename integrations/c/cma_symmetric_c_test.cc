// The symmetric heap's C ABI on the host backend: members in one process,
// members in two processes bootstrapped by an all-gather callback (as a
// framework's communicator would), errors, and the unified statistics.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/time/clock.h"

#include "gmock/gmock.h"
#include "integrations/c/capi_test_util.h"
#include "gtest/gtest.h"
#include "integrations/c/cma_c.h"
#include "nlohmann/json.hpp"

namespace {

using ::testing::HasSubstr;

using cma_test::Json;
using SymmetricCApiTest = cma_test::HostCApiTest;

// The NVSHMEM provider through the C ABI (the host backend's emulation):
// one member per process, put/get with their errors, a bad provider named.
TEST_F(SymmetricCApiTest, NvshmemProviderWithPutAndGet) {
  const int ranks[] = {0, 1}, devices[] = {0, 1};
  EXPECT_EQ(cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 10.0,
                                 "provider:shmem"),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("provider:vmm|nvshmem"));
  EXPECT_EQ(cma_symmetric_create(2, ranks, devices, 2, 0, 1, nullptr, nullptr, 10.0,
                                 "provider:nvshmem"),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("one member (PE) per process"));
  cma_symmetric_heap* h =
      cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 10.0, "provider:nvshmem");
  ASSERT_NE(h, nullptr) << cma_last_error();
  cma_symmetric_allocation* a = cma_symmetric_alloc(h, 4096, 0);
  ASSERT_NE(a, nullptr) << cma_last_error();
  const char text[] = "symmetric";
  ASSERT_EQ(cma_symmetric_put(a, 0, 100, text, sizeof(text), nullptr), 0) << cma_last_error();
  EXPECT_STREQ(static_cast<const char*>(cma_symmetric_peer(a, 0)) + 100, text);
  char back[sizeof(text)] = {};
  ASSERT_EQ(cma_symmetric_get(a, 0, 100, back, sizeof(back), nullptr), 0) << cma_last_error();
  EXPECT_STREQ(back, text);
  EXPECT_EQ(cma_symmetric_put(a, 0, 4090, text, sizeof(text), nullptr), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("past the allocation's 4096 bytes"));
  EXPECT_EQ(cma_symmetric_get(a, 3, 0, back, 1, nullptr), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("member 3"));
  ASSERT_EQ(cma_symmetric_free(h, a), 0);
  EXPECT_EQ(cma_symmetric_put(a, 0, 0, text, 1, nullptr), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("not a live symmetric allocation"));
  ASSERT_EQ(cma_symmetric_empty_cache(h), 0) << cma_last_error();
  cma_symmetric_destroy(h);
}

TEST_F(SymmetricCApiTest, TwoMembersInOneProcessShareBuffersAndTheCache) {
  const int ranks[] = {0, 1}, devices[] = {0, 1};
  cma_symmetric_heap* h =
      cma_symmetric_create(2, ranks, devices, 2, 0, 1, nullptr, nullptr, 10.0, "signal_bytes:64");
  ASSERT_NE(h, nullptr) << cma_last_error();
  EXPECT_EQ(cma_symmetric_signal_size(h), 64u);
  cma_symmetric_allocation* a = cma_symmetric_alloc(h, 1 << 20, 0);
  ASSERT_NE(a, nullptr) << cma_last_error();
  EXPECT_EQ(cma_symmetric_size(a), 1u << 20);
  auto* p0 = static_cast<std::int32_t*>(cma_symmetric_peer(a, 0));
  auto* p1 = static_cast<std::int32_t*>(cma_symmetric_peer(a, 1));
  ASSERT_NE(p0, nullptr);
  ASSERT_NE(p1, nullptr);
  p1[7] = 42;  // member 0 writes into member 1's buffer
  EXPECT_EQ(static_cast<std::int32_t*>(cma_symmetric_peer(a, 1))[7], 42);
  EXPECT_NE(cma_symmetric_signal(a, 1), nullptr);
  auto** table = static_cast<void**>(cma_symmetric_device_peers(a));
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table[1], p1);
  EXPECT_EQ(cma_symmetric_peer(a, 2), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("no member 2"));
  // One statistics view: managed and symmetric side by side, per device.
  auto all = Json(cma_stats_json(-1));
  EXPECT_GE(all["symmetric_bytes.current"].get<std::int64_t>(), 2 << 20);
  EXPECT_EQ(all["symmetric_allocations"], 1);
  EXPECT_TRUE(all.contains("reserved_bytes.all.current"));
  auto d1 = Json(cma_stats_json(1));
  EXPECT_EQ(d1["symmetric_bytes.current"].get<std::int64_t>() * 2,
            all["symmetric_bytes.current"].get<std::int64_t>());
  ASSERT_EQ(cma_symmetric_free(h, a), 0) << cma_last_error();
  // Cached: the same size again makes no exchange and no driver call.
  cma_symmetric_allocation* b = cma_symmetric_alloc(h, 1 << 20, 0);
  ASSERT_NE(b, nullptr);
  auto s = Json(cma_symmetric_stats_json(h));
  EXPECT_EQ(s["cache_hits"], 1);
  EXPECT_EQ(cma_symmetric_free(h, b), 0);
  EXPECT_EQ(cma_symmetric_empty_cache(h), 0);
  EXPECT_EQ(Json(cma_symmetric_stats_json(h))["symmetric_bytes"], 0);
  cma_symmetric_destroy(h);
  EXPECT_FALSE(Json(cma_stats_json(-1)).contains("nothing"));
  EXPECT_EQ(Json(cma_stats_json(-1))["symmetric_allocations"], 0);  // heap gone
}

// NCCL windows through the C ABI (on the host backend's emulated
// communicators): registered, cached, refused for a freed handle, released.
TEST_F(SymmetricCApiTest, NcclWindowsAreRegisteredCachedAndReleased) {
  const int ranks[] = {0}, devices[] = {0};
  cma_symmetric_heap* h =
      cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 10.0, "");
  ASSERT_NE(h, nullptr) << cma_last_error();
  void* comm = cma_host_emulated_comm(0, 1, 0);
  ASSERT_NE(comm, nullptr) << cma_last_error();
  cma_symmetric_allocation* a = cma_symmetric_alloc(h, 1 << 20, 0);
  ASSERT_NE(a, nullptr) << cma_last_error();
  void* w = nullptr;
  ASSERT_EQ(cma_symmetric_register_nccl_window(h, a, comm, &w), 0) << cma_last_error();
  EXPECT_NE(w, nullptr);
  void* again = nullptr;
  ASSERT_EQ(cma_symmetric_register_nccl_window(h, a, comm, &again), 0);
  EXPECT_EQ(again, w);
  EXPECT_EQ(Json(cma_symmetric_stats_json(h))["windows"], 1);
  EXPECT_EQ(cma_symmetric_register_nccl_window(h, a, cma_host_emulated_comm(0, 2, 0), &again),
            -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("rank 0 of 2"));
  EXPECT_EQ(cma_symmetric_register_nccl_window(h, a, comm, nullptr), 0);  // the window is optional
  EXPECT_EQ(cma_host_emulated_comm(1, 1, 0), nullptr);
  ASSERT_EQ(cma_symmetric_free(h, a), 0);
  EXPECT_EQ(cma_symmetric_register_nccl_window(h, a, comm, &again), -1);  // freed
  EXPECT_THAT(cma_last_error(), HasSubstr("not live here"));
  EXPECT_EQ(again, nullptr);
  EXPECT_EQ(cma_symmetric_release_nccl_windows(h, comm), 1);  // the cached allocation's
  EXPECT_EQ(Json(cma_symmetric_stats_json(h))["windows"], 0);
  EXPECT_EQ(cma_symmetric_release_nccl_windows(h, nullptr), -1);
  EXPECT_EQ(cma_symmetric_empty_cache(h), 0);
  cma_symmetric_destroy(h);
}

// A freed handle stays refused when the heap hands the same allocation out
// again: the stale free fails and the new owner's allocation stays live.
TEST_F(SymmetricCApiTest, AStaleHandleIsRefusedAfterACacheHit) {
  const int ranks[] = {0, 1}, devices[] = {0, 1};
  cma_symmetric_heap* h =
      cma_symmetric_create(2, ranks, devices, 2, 0, 1, nullptr, nullptr, 10.0, "");
  ASSERT_NE(h, nullptr) << cma_last_error();
  cma_symmetric_allocation* a = cma_symmetric_alloc(h, 4096, 0);
  ASSERT_NE(a, nullptr) << cma_last_error();
  void* buffer = cma_symmetric_peer(a, 0);
  ASSERT_EQ(cma_symmetric_free(h, a), 0) << cma_last_error();
  cma_symmetric_allocation* b = cma_symmetric_alloc(h, 4096, 0);  // a hit
  ASSERT_NE(b, nullptr) << cma_last_error();
  ASSERT_EQ(cma_symmetric_peer(b, 0), buffer);
  EXPECT_EQ(cma_symmetric_free(h, a), -1);
  EXPECT_THAT(cma_last_error(), HasSubstr("not a live symmetric allocation"));
  EXPECT_EQ(cma_symmetric_peer(a, 0), nullptr);
  // b is still owned: the next alloc is a miss, another buffer.
  cma_symmetric_allocation* c = cma_symmetric_alloc(h, 4096, 0);
  ASSERT_NE(c, nullptr) << cma_last_error();
  EXPECT_NE(cma_symmetric_peer(c, 0), buffer);
  EXPECT_EQ(Json(cma_symmetric_stats_json(h))["cache_hits"], 1);
  EXPECT_EQ(cma_symmetric_free(h, b), 0) << cma_last_error();
  EXPECT_EQ(cma_symmetric_free(h, c), 0) << cma_last_error();
  cma_symmetric_destroy(h);
}

TEST_F(SymmetricCApiTest, BadArgumentsAreClearErrors) {
  const int ranks[] = {0}, devices[] = {0};
  EXPECT_EQ(cma_symmetric_create(0, ranks, devices, 1, 0, 1, nullptr, nullptr, 1, ""), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("world_size"));
  EXPECT_EQ(cma_symmetric_create(2, ranks, devices, 1, 0, 2, nullptr, nullptr, 1, ""), nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("allgather callback"));
  EXPECT_EQ(cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 1, "colour:red"),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("bad option 'colour:red'"));
  EXPECT_EQ(cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 1, "handles:nvlink"),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("handles:fd|fabric|fabric_or_fd"));
  // The host backend exports no fabric handles: asked for, the create fails
  // naming the device; with the fallback it makes a POSIX FD heap.
  EXPECT_EQ(cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 1, "handles:fabric"),
            nullptr);
  EXPECT_THAT(cma_last_error(), HasSubstr("device 0"));
  cma_symmetric_heap* fd = cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 1,
                                                "handles:fabric_or_fd");
  EXPECT_NE(fd, nullptr) << cma_last_error();
  cma_symmetric_allocation* one = cma_symmetric_alloc(fd, 4096, 0);
  EXPECT_NE(one, nullptr) << cma_last_error();
  EXPECT_EQ(cma_symmetric_free(fd, one), 0) << cma_last_error();
  cma_symmetric_destroy(fd);
  // An infinite timeout would turn a dead member into a hang: refused, named.
  cma_allgather_fn echo = [](void*, const void* send, size_t len, void* recv) {
    std::memcpy(recv, send, len);
    return 0;
  };
  // So would one above 2^31 ms (24.8 days), once an int: every timeout past
  // 24 h, NaN and non-positive ones are refused, with or without a callback
  // (issue 19, item 12).
  for (double t : {double{INFINITY}, -double{INFINITY}, double{NAN}, 25.0 * 86400, 86400.0 + 1e-3,
                   0.0, -1.0}) {
    for (cma_allgather_fn cb : {echo, static_cast<cma_allgather_fn>(nullptr)}) {
      EXPECT_EQ(cma_symmetric_create(1, ranks, devices, 1, 0, 1, cb, nullptr, t, ""), nullptr)
          << t;
      EXPECT_THAT(cma_last_error(), HasSubstr("timeout must be positive and at most 24h")) << t;
    }
  }
  cma_symmetric_heap* day = cma_symmetric_create(1, ranks, devices, 1, 0, 1, echo, nullptr,
                                                 86400.0, "");
  EXPECT_NE(day, nullptr) << cma_last_error();  // 24 h itself is allowed
  cma_symmetric_destroy(day);
  EXPECT_EQ(cma_symmetric_alloc(nullptr, 10, 0), nullptr);
  EXPECT_EQ(cma_symmetric_free(nullptr, nullptr), -1);
  cma_symmetric_heap* h = cma_symmetric_create(1, ranks, devices, 1, 0, 1, nullptr, nullptr, 1, "");
  ASSERT_NE(h, nullptr) << cma_last_error();
  EXPECT_EQ(cma_symmetric_alloc(h, 0, 0), nullptr);  // size 0
  EXPECT_NE(std::string(cma_last_error()), "");
  cma_symmetric_destroy(h);
}

// An all-gather between two processes over a socket pair, as a framework's
// communicator would provide: ctx is {my index, my end of the pair}.
int PairAllGather(void* ctx, const void* send, size_t len, void* recv) {
  const int* c = static_cast<const int*>(ctx);
  const int me = c[0], fd = c[1];
  if (write(fd, send, len) != static_cast<ssize_t>(len)) return 1;
  char* out = static_cast<char*>(recv);
  std::memcpy(out + me * len, send, len);
  std::size_t got = 0;
  while (got < len) {
    const ssize_t n = read(fd, out + (1 - me) * len + got, len - got);
    if (n <= 0) return 1;
    got += static_cast<std::size_t>(n);
  }
  return 0;
}

TEST(SymmetricCApiProcessTest, TwoProcessesWriteIntoEachOthersBuffers) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    if (pids[r] != 0) continue;
    auto run = [&]() -> bool {
      if (cma_init("", "host") != 0) return false;
      int ctx[2] = {r, pair[r]};
      const int rank = r, device = 0;
      cma_symmetric_heap* h =
          cma_symmetric_create(2, &rank, &device, 1, r, 2, PairAllGather, ctx, 20.0, "");
      if (h == nullptr) return false;
      cma_symmetric_allocation* a = cma_symmetric_alloc(h, 4096, /*make_symmetric=*/1);
      if (a == nullptr) return false;
      // Slot r of the other member's buffer gets 100 + r.
      static_cast<std::int32_t*>(cma_symmetric_peer(a, 1 - r))[r] = 100 + r;
      if (cma_symmetric_empty_cache(h) != 0) return false;  // collective: both have written
      const bool seen = static_cast<std::int32_t*>(cma_symmetric_peer(a, r))[1 - r] == 101 - r;
      const bool freed = cma_symmetric_free(h, a) == 0;
      cma_symmetric_destroy(h);
      cma_shutdown();
      return seen && freed;
    };
    _exit(run() ? 0 : 1);
  }
  close(pair[0]);
  close(pair[1]);
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "process " << r;
  }
}

// Issue 47: bad arguments on one process (a rank out of range, an option,
// a timeout) fail cma_symmetric_create on every process at once, naming
// that process. Before, that process alone got NULL: with a bad rank the
// other got a heap whose first collective waited out its timeout; with a
// bad option or timeout it waited in the framework's all-gather.
TEST(SymmetricCApiProcessTest, BadArgumentsOnOneProcessFailEveryProcessAtOnce) {
  struct Case {
    const char* what;
    int rank1;
    const char* options1;
    double timeout1;
    const char* says1;  // process 1's own error
  };
  const Case cases[] = {
      {"a rank out of range", 5, "", 20.0, "local rank 5 is out of range"},
      {"a bad option", 1, "colour:red", 20.0, "bad option 'colour:red'"},
      {"a bad timeout", 1, "", -1.0, "timeout must be positive"},
  };
  for (const Case& c : cases) {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
    const absl::Time start = absl::Now();
    pid_t pids[2];
    for (int r = 0; r < 2; ++r) {
      pids[r] = fork();
      if (pids[r] != 0) continue;
      close(pair[1 - r]);  // so that the other's exit is seen, not waited for
      auto run = [&]() -> bool {
        if (cma_init("", "host") != 0) return false;
        int ctx[2] = {r, pair[r]};
        const int rank = r == 1 ? c.rank1 : 0, device = 0;
        cma_symmetric_heap* h = cma_symmetric_create(
            2, &rank, &device, 1, r, 2, PairAllGather, ctx, r == 1 ? c.timeout1 : 20.0,
            r == 1 ? c.options1 : "");
        const std::string error = cma_last_error();
        if (h != nullptr) {
          std::fprintf(stderr, "%s: process %d made a heap\n", c.what, r);
          cma_symmetric_destroy(h);
          return false;
        }
        const bool named = r == 1 ? error.find(c.says1) != std::string::npos
                                  : error.find("process 1") != std::string::npos;
        if (!named) std::fprintf(stderr, "%s: process %d: %s\n", c.what, r, error.c_str());
        cma_shutdown();
        return named;
      };
      _exit(run() ? 0 : 1);
    }
    close(pair[0]);
    close(pair[1]);
    for (int r = 0; r < 2; ++r) {
      int status = 0;
      waitpid(pids[r], &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << c.what << ": process " << r;
    }
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << c.what << ": at once, not at a timeout";
  }
}

}  // namespace
