// Shared helpers for the symmetric heap's multi-process tests: members are
// forked processes on real Unix sockets, each with its own host backend.
#ifndef CMA_TESTS_SYMMETRIC_PROCESS_UTIL_H_
#define CMA_TESTS_SYMMETRIC_PROCESS_UTIL_H_

#include <sys/wait.h>
#include <cstdio>
#include <unistd.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/host/host_backend.h"

namespace cma {

inline constexpr absl::Duration kTimeout = absl::Seconds(5);

// One rendezvous token for this test process; forked members inherit it
// (SocketPath makes it before any fork).
inline const std::string& Token() {
  static const std::string* token = new std::string(*MakeRendezvousToken());
  return *token;
}

inline std::string SocketPath(const char* test) {
  Token();
  return absl::StrFormat("/tmp/cma-test-%s-%d.sock", test, getpid());
}

// Runs `body(rank)` in `n` forked processes; returns their exit codes.
// Each child exits with 0 when body returns true.
inline std::vector<int> RunProcesses(int n, const std::function<bool(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      bool ok = false;
      ok = body(r);
      _exit(ok ? 0 : 1);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

// One member per process, each with its own backend, as on one host with one
// GPU per process.
inline std::unique_ptr<SymmetricHeap> ProcessHeap(Backend& b, const std::string& path, int rank,
                                                  int world, absl::Duration timeout = kTimeout,
                                                  SymmetricOptions options = {}) {
  auto x = MakeUnixSocketExchange(path, rank, world, timeout, Token());
  if (!x.ok()) return nullptr;
  SymmetricGroup g;
  g.world_size = world;
  g.local_ranks = {rank};
  g.local_devices = {0};
  auto h = SymmetricHeap::Create(b, g, std::move(*x), options);
  if (!h.ok()) fprintf(stderr, "rank %d: %s\n", rank, std::string(h.status().message()).c_str());
  return h.ok() ? std::move(*h) : nullptr;
}

// The options of a heap of `provider` (the multi-process suites run on both).
inline SymmetricOptions WithProvider(SymmetricProvider provider) {
  SymmetricOptions o;
  o.provider = provider;
  return o;
}

}  // namespace cma

#endif  // CMA_TESTS_SYMMETRIC_PROCESS_UTIL_H_
