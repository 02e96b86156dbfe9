// The cost of a two-process socket rendezvous on this host: process 0
// listens, a forked member connects and both exchange one round
// (MakeUnixSocketExchange + one AllGather, as SymmetricHeap's first miss
// does). Process 0 is already listening when the member starts, so the
// figure is the handshake and the round, not the member's connect retry.
//
//   ./bazelw run -c opt //bench:rendezvous_bench -- [rounds]
//
// Prints the median and the 90th percentile over `rounds` (default 200), in
// microseconds, as measured by the member.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "allocator/symmetric/exchange.h"

namespace {

constexpr absl::Duration kTimeout = absl::Seconds(10);

// One rendezvous; returns the member's elapsed microseconds, or -1.
double OneRound(const std::string& path, const std::string& token) {
  const pid_t root = fork();
  if (root == 0) {
    auto x = cma::MakeUnixSocketExchange(path, 0, 2, kTimeout, token);
    const bool ok = x.ok() && (*x)->AllGather({"zero", {}}).ok();
    _exit(ok ? 0 : 1);
  }
  struct stat st {};
  while (stat(path.c_str(), &st) != 0) usleep(50);  // listening
  const absl::Time t0 = absl::Now();
  auto x = cma::MakeUnixSocketExchange(path, 1, 2, kTimeout, token);
  const bool ok = x.ok() && (*x)->AllGather({"one", {}}).ok();
  const double us = absl::ToDoubleMicroseconds(absl::Now() - t0);
  int status = 0;
  waitpid(root, &status, 0);
  return ok && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? us : -1;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 200;
  const std::string token = *cma::MakeRendezvousToken();
  const std::string path = absl::StrFormat("/tmp/cma-rdv-bench-%d.sock", getpid());
  std::vector<double> us;
  for (int i = 0; i < rounds; ++i) {
    const double t = OneRound(path, token);
    if (t < 0) {
      std::fprintf(stderr, "rendezvous_bench: round %d failed\n", i);
      return 1;
    }
    us.push_back(t);
  }
  std::sort(us.begin(), us.end());
  std::printf("two-process rendezvous + one round: median %.1f us, p90 %.1f us (%d rounds)\n",
              us[us.size() / 2], us[us.size() * 9 / 10], rounds);
  return 0;
}
