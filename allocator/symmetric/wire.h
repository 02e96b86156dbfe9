// The rendezvous wire protocol of the Unix socket exchange (exchange.h):
// frames carrying bytes and FDs, and the hello with which a member presents
// its index and the rendezvous token. Internal to allocator/symmetric;
// exposed for the exchange, its tests and its fuzzer.
//
// Every read and write is bounded by `deadline`. Sizes read from a peer are
// checked against kMaxFrameBytes, kMaxFds and kMaxTokenBytes before any
// allocation. Received FDs belong to the caller.
#ifndef CMA_ALLOCATOR_SYMMETRIC_WIRE_H_
#define CMA_ALLOCATOR_SYMMETRIC_WIRE_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/symmetric/exchange.h"

namespace cma {
namespace wire {

inline constexpr int kMaxFds = 250;  // under SCM_MAX_FD

void CloseAll(std::vector<int>& fds);
absl::Status Errno(const std::string& what);
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& who);
absl::Status WriteAll(int fd, const void* data, std::size_t n, absl::Time deadline,
                      const std::string& who);
absl::Status ReadAll(int fd, void* data, std::size_t n, absl::Time deadline,
                     const std::string& who);

// One frame: a header (carrying the FDs) then the bytes. `ok` false sends an
// error frame whose bytes are the reason (the receiver gets kAborted).
absl::Status SendFrame(int sock, bool ok, const Contribution& c, absl::Time deadline,
                       const std::string& who);
absl::StatusOr<Contribution> RecvFrame(int sock, absl::Time deadline, const std::string& who);

// The effective uid of the process at the other end of a Unix socket.
absl::StatusOr<uid_t> PeerUid(int sock);
absl::Status CheckToken(const std::string& token);
bool TokensEqual(const std::string& a, const std::string& b);

// Member side: hello (index, token), then wait for process 0's welcome
// (kPermissionDenied when it closes instead).
absl::Status SendHello(int sock, int index, const std::string& token, absl::Time deadline);
absl::Status ReadWelcome(int sock, absl::Time deadline);
// Process 0 side: the connector's member index once its hello carries
// `token` and an index in [1, process_count); kPermissionDenied (with the
// reason) otherwise.
absl::StatusOr<int> ReadHello(int sock, const std::string& token, int process_count,
                              absl::Time deadline);
absl::Status SendWelcome(int sock, absl::Time deadline);

}  // namespace wire
}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_WIRE_H_
