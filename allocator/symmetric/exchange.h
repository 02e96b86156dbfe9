// Exchange: how the processes of a symmetric group rendezvous. One call,
// AllGather, gives every process every process's contribution: a few bytes
// of metadata plus file descriptors (exported VMM handles).
//
// Implementations: SingleProcessExchange (all members in one process: no
// communication), UnixSocketExchange (processes on one host; FDs cross with
// SCM_RIGHTS), and MakeCallbackExchange (a framework's own communicator,
// such as torch.distributed or MPI, bootstraps a UnixSocketExchange).
//
// Contract: AllGather is collective; every process calls it the same number
// of times. Every wait is bounded by the exchange's timeout: a process that
// dies or never arrives gives the others kDeadlineExceeded or kUnavailable
// naming it, never a hang. Received FDs belong to the caller (close them).
// An Exchange is used by one thread at a time.
#ifndef CMA_ALLOCATOR_SYMMETRIC_EXCHANGE_H_
#define CMA_ALLOCATOR_SYMMETRIC_EXCHANGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cma {

struct Contribution {
  std::string bytes;
  std::vector<int> fds;  // sent: still owned by the sender; received: owned by the caller
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int process_count() const = 0;
  virtual int process_index() const = 0;
  // Contributions of all processes, in process order.
  virtual absl::StatusOr<std::vector<Contribution>> AllGather(const Contribution& mine) = 0;
};

// Every member in this process: AllGather returns the caller's contribution
// (with dup'ed FDs, so ownership rules are the same as for other exchanges).
std::unique_ptr<Exchange> MakeSingleProcessExchange();

// Processes on one host meet at a Unix socket path; process 0 listens there.
// `timeout` bounds connection set-up and every AllGather.
absl::StatusOr<std::unique_ptr<Exchange>> MakeUnixSocketExchange(const std::string& path,
                                                                  int process_index,
                                                                  int process_count,
                                                                  absl::Duration timeout);

// A framework's all-gather of fixed-size byte buffers: `send` (len bytes)
// from every rank lands in `recv` (count * len bytes, rank order). Returns 0
// on success.
using AllGatherCallback = int (*)(void* ctx, const void* send, size_t len, void* recv);

// Uses `callback` once, to agree on a socket path created by process 0, then
// exchanges through a UnixSocketExchange (FDs cannot travel through a
// framework's communicator).
absl::StatusOr<std::unique_ptr<Exchange>> MakeCallbackExchange(AllGatherCallback callback,
                                                               void* ctx, int process_index,
                                                               int process_count,
                                                               absl::Duration timeout);

}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_EXCHANGE_H_
