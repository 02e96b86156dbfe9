// MakeCallbackExchange: a framework's all-gather hands every member process
// 0's socket name, rendezvous token and pid; the exchange itself then runs
// over a Unix socket (FDs cannot travel through a framework's communicator).
//
// The socket is in the abstract namespace, under a random name that process
// 0 binds before publishing it: there is no file or directory to leave
// behind when process 0 is killed (a path in a private directory left both
// in /tmp), none to swap, and no one can listen under the name in its place.
// Anyone in the network namespace may connect; the handshake's SO_PEERCRED
// and HMAC checks (wire.h) turn away all but the members.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/socket_rendezvous.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace {

// Process 0's entry: the socket name, the token (each NUL-padded), its pid.
constexpr std::size_t kName = sizeof(sockaddr_un::sun_path);
constexpr std::size_t kLen = kName + kMaxTokenBytes + sizeof(std::int32_t);

// Process 0's listener under a fresh random abstract name ("@cma-symmetric-"
// and 32 hex digits); a name in use (practically never) is a bind error.
absl::Status ListenAbstract(int process_count, std::string* name, int* listener) {
  absl::StatusOr<std::string> random = wire::RandomBytes(16);
  if (!random.ok()) return random.status();
  *name = absl::StrCat("@cma-symmetric-", absl::BytesToHexString(*random));
  absl::StatusOr<rendezvous::SocketAddress> at = rendezvous::Address(*name);
  if (!at.ok()) return at.status();
  const int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (l < 0) return wire::Errno("socket");
  if (bind(l, reinterpret_cast<const sockaddr*>(&at->addr), at->len) != 0 ||
      listen(l, process_count + 8) != 0) {
    absl::Status s = wire::Errno(absl::StrCat("symmetric exchange: bind/listen on ", *name));
    close(l);
    return s;
  }
  *listener = l;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Exchange>> MakeCallbackExchange(AllGatherCallback callback,
                                                               void* ctx, int process_index,
                                                               int process_count,
                                                               absl::Duration timeout) {
  if (callback == nullptr) return absl::InvalidArgumentError("symmetric exchange: null callback");
  if (absl::Status s = rendezvous::CheckMember(process_index, process_count); !s.ok()) return s;
  if (absl::Status s = rendezvous::CheckTimeout(timeout); !s.ok()) return s;
  if (absl::Status s = wire::CryptoReady(); !s.ok()) return s;
  std::string mine(kLen, '\0');
  int listener = -1;
  if (process_index == 0) {
    // Listening before the name is published: no one can take it first.
    std::string name;
    if (absl::Status s = ListenAbstract(process_count, &name, &listener); !s.ok()) return s;
    absl::StatusOr<std::string> token = MakeRendezvousToken();
    if (!token.ok()) {
      close(listener);
      return token.status();
    }
    const std::int32_t pid = getpid();
    std::memcpy(mine.data(), name.data(), name.size());
    std::memcpy(mine.data() + kName, token->data(), token->size());
    std::memcpy(mine.data() + kName + kMaxTokenBytes, &pid, sizeof(pid));
  }
  std::string all(kLen * static_cast<std::size_t>(process_count), '\0');
  if (callback(ctx, mine.data(), kLen, all.data()) != 0) {
    if (listener >= 0) close(listener);
    return absl::UnavailableError("symmetric exchange: the framework's all-gather failed");
  }
  const std::string name(all.data(), strnlen(all.data(), kName));
  const std::string token(all.data() + kName, strnlen(all.data() + kName, kMaxTokenBytes));
  const absl::Time deadline = absl::Now() + timeout;
  if (process_index == 0) return rendezvous::AsRoot(listener, process_count, timeout, token, deadline);
  std::int32_t root_pid = 0;
  std::memcpy(&root_pid, all.data() + kName + kMaxTokenBytes, sizeof(root_pid));
  if (absl::Status s = wire::CheckToken(token); !s.ok()) return s;
  absl::StatusOr<rendezvous::SocketAddress> at = rendezvous::Address(name);
  if (!at.ok() || name[0] != '@' || root_pid <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric exchange: the framework's all-gather did not carry process 0's entry (socket "
        "name '%s', pid %d): is this process's index %d right?",
        name, root_pid, process_index));
  }
  return rendezvous::AsMember(name, *at, process_index, process_count, timeout, token, deadline,
                              root_pid);
}

}  // namespace cma
