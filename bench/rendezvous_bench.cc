// The cost of a two-process socket rendezvous on this host: process 0
// listens, a member connects and both exchange one round
// (MakeUnixSocketExchange + one AllGather, as SymmetricHeap's first miss
// does).
//
//   ./bazelw run -c opt //bench:rendezvous_bench -- [rounds]
//
// Two long-lived processes rendezvous `rounds` times (default 300), so the
// figure is the protocol's steady cost, not process start-up or the first
// touch of code and libraries. Process 0 is already listening when the
// member starts its clock (a connect before listen() is refused and retried
// 5 ms later, which would swamp the figure). Prints the median and the 90th
// percentile, as measured by the member, in microseconds, and the median of
// the connecting part (MakeUnixSocketExchange) alone.
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

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::max(2, std::atoi(argv[1])) : 300;
  const std::string token = *cma::MakeRendezvousToken();
  const std::string base = absl::StrFormat("/tmp/cma-rdv-bench-%d", getpid());
  const pid_t root = fork();
  if (root == 0) {
    for (int i = 0; i < rounds; ++i) {
      auto x = cma::MakeUnixSocketExchange(absl::StrFormat("%s-%d.sock", base, i), 0, 2, kTimeout,
                                           token);
      if (!x.ok() || !(*x)->AllGather({"zero", {}}).ok()) _exit(1);
    }
    _exit(0);
  }
  std::vector<double> us, connect;
  for (int i = 0; i < rounds; ++i) {
    const std::string path = absl::StrFormat("%s-%d.sock", base, i);
    struct stat st {};
    while (stat(path.c_str(), &st) != 0) usleep(20);  // bound
    usleep(300);                                       // and listening
    const absl::Time t0 = absl::Now();
    auto x = cma::MakeUnixSocketExchange(path, 1, 2, kTimeout, token);
    const double c = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (!x.ok() || !(*x)->AllGather({"one", {}}).ok()) {
      std::fprintf(stderr, "rendezvous_bench: round %d failed\n", i);
      return 1;
    }
    const double t = absl::ToDoubleMicroseconds(absl::Now() - t0);
    if (i > 0) {  // the first round touches everything for the first time
      us.push_back(t);
      connect.push_back(c);
    }
  }
  int status = 0;
  waitpid(root, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "rendezvous_bench: process 0 failed\n");
    return 1;
  }
  std::sort(us.begin(), us.end());
  std::sort(connect.begin(), connect.end());
  std::printf(
      "two-process rendezvous + one round: median %.1f us, p90 %.1f us (%d rounds); "
      "of which connecting: median %.1f us\n",
      us[us.size() / 2], us[us.size() * 9 / 10], rounds - 1, connect[connect.size() / 2]);
  return 0;
}
