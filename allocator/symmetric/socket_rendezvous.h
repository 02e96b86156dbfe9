// The two sides of the Unix socket rendezvous, for the bootstraps that
// build on it (MakeUnixSocketExchange on a path, MakeCallbackExchange on an
// abstract name). Internal to allocator/symmetric; exchange.h states the
// public contract.
#ifndef CMA_ALLOCATOR_SYMMETRIC_SOCKET_RENDEZVOUS_H_
#define CMA_ALLOCATOR_SYMMETRIC_SOCKET_RENDEZVOUS_H_

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/symmetric/exchange.h"

namespace cma {
namespace rendezvous {

struct SocketAddress {
  sockaddr_un addr{};
  socklen_t len = 0;
};
// A path, or with a leading '@' a name in the abstract namespace (Linux):
// such a socket has no file, so nothing is left behind when its process is
// killed, and it belongs to whoever bound it first until closed.
// kInvalidArgument if it does not fit sun_path.
absl::StatusOr<SocketAddress> Address(const std::string& path);

// kInvalidArgument naming the problem, as exchange.h describes.
absl::Status CheckMember(int process_index, int process_count);
absl::Status CheckTimeout(absl::Duration timeout);

// Process 0: accepts on `listener` until every member has proved it knows
// the token and claimed a free index (`peers[i]`, its connection), reading
// every pending connector at once, each against its own deadline, and
// turning away everyone else. A member let in that leaves frees its index.
// kDeadlineExceeded at `deadline` naming the processes that never connected
// (and the connections rejected); other errors are our own failures.
absl::Status AcceptMembers(int listener, int process_count, const std::string& token,
                           absl::Time deadline, std::vector<int>& peers);
// Sends `failure` to every member let in (so that each member's first
// AllGather names the real cause); returns process 0's own status.
absl::Status TellMembers(const absl::Status& failure, const std::vector<int>& peers);

// Process 0, on a listening socket (closed here on every path): admits
// every member (wire.h's handshake) by `deadline`, or tells those admitted
// why not. The token must have passed wire::CheckToken.
absl::StatusOr<std::unique_ptr<Exchange>> AsRoot(int listener, int process_count,
                                                 absl::Duration timeout, const std::string& token,
                                                 absl::Time deadline);
// A member: connects to process 0 at `root` (retrying until it listens or
// `deadline`) and proves itself. `root_pid`, when not 0, is the pid that
// process 0 published through another channel: a listener with another pid
// is refused (kPermissionDenied). `path` names the socket in messages.
absl::StatusOr<std::unique_ptr<Exchange>> AsMember(const std::string& path,
                                                   const SocketAddress& root, int process_index,
                                                   int process_count, absl::Duration timeout,
                                                   const std::string& token, absl::Time deadline,
                                                   pid_t root_pid);

}  // namespace rendezvous
}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_SOCKET_RENDEZVOUS_H_
