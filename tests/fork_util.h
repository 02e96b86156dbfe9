// Helpers for tests that run real processes (fork) on real Unix sockets.
#ifndef CMA_TESTS_FORK_UTIL_H_
#define CMA_TESTS_FORK_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>

#include "absl/strings/str_format.h"

namespace cma {

// A socket path of this process's own for `test`, under a per-file `tag`.
inline std::string SocketPath(const char* tag, const char* test) {
  return absl::StrFormat("/tmp/cma-%s-%s-%d.sock", tag, test, getpid());
}

// Runs `body` in a child that exits 0 when it returns true.
inline pid_t Spawn(const std::function<bool()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body() ? 0 : 1);
  return pid;
}

// The child's exit status, or 128 + the signal that ended it.
inline int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace cma

#endif  // CMA_TESTS_FORK_UTIL_H_
