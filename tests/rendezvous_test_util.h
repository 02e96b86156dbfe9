// Helpers for the rendezvous tests: a listener that plays process 0, and an
// all-gather that hands a member process 0's published entry.
#ifndef CMA_TESTS_RENDEZVOUS_TEST_UTIL_H_
#define CMA_TESTS_RENDEZVOUS_TEST_UTIL_H_

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "allocator/symmetric/exchange.h"

namespace cma {

// A Unix socket bound to `path` and listening (a stand-in for process 0);
// -1 if it cannot be.
inline int ListenAt(const std::string& path) {
  const int l = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l, 4) != 0) return -1;
  return l;
}

// Process 0's entry as a framework's all-gather returns it to member 1 of
// 2: its listener's name, its token and its pid.
struct RootEntry {
  std::string name;
  std::int32_t pid;
  std::string token;

  static int Gather(void* c, const void*, size_t len, void* recv) {
    auto* x = static_cast<RootEntry*>(c);
    std::memset(recv, 0, 2 * len);
    std::memcpy(recv, x->name.c_str(), x->name.size());
    std::memcpy(static_cast<char*>(recv) + sizeof(sockaddr_un::sun_path), x->token.data(),
                x->token.size());
    std::memcpy(static_cast<char*>(recv) + sizeof(sockaddr_un::sun_path) + kMaxTokenBytes,
                &x->pid, sizeof(x->pid));
    return 0;
  }
};

}  // namespace cma

#endif  // CMA_TESTS_RENDEZVOUS_TEST_UTIL_H_
