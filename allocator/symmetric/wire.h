// The rendezvous wire protocol of the Unix socket exchange (exchange.h):
// frames carrying bytes and FDs, and the handshake with which a member and
// process 0 prove to each other that they know the rendezvous token.
// Internal to allocator/symmetric; exposed for the exchange, its tests and
// its fuzzer.
//
// The handshake (mutual challenge-response; the token never crosses the
// socket, so a process that listens or connects in its place learns nothing
// it could replay), in as many messages as a plain hello and welcome:
//   member -> process 0:  hello      {magic, version, index, pid1, nonce1}
//   process 0 -> member:  challenge  {magic, version, pid0, 0, nonce0,
//                                     HMAC-SHA256(token, "cma-root" version index pid0
//                                                 nonce1 nonce0)}
//   member -> process 0:  proof      {magic,
//                                     HMAC-SHA256(token, "cma-memb" version index pid1
//                                                 nonce0 nonce1)}
// Each side checks with SO_PEERCRED that the process at the other end of
// the socket runs as this user and is the one whose pid the MAC covers (a
// same-user relay that forwards a real member's messages is refused). The
// member sends its proof only once process 0 has proved itself.
//
// Every read and write is bounded by `deadline` (an infinite deadline is
// allowed; waits wake at least once a minute). Sizes read from a peer are
// checked against kMaxFrameBytes and kMaxFds before any allocation.
// Received FDs belong to the caller on every path: a failed receive closes
// them itself.
#ifndef CMA_ALLOCATOR_SYMMETRIC_WIRE_H_
#define CMA_ALLOCATOR_SYMMETRIC_WIRE_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "allocator/symmetric/exchange.h"

namespace cma {
namespace wire {

inline constexpr int kMaxFds = 250;  // under SCM_MAX_FD
inline constexpr std::size_t kNonceBytes = 16;  // 128 random bits: never repeats
inline constexpr std::size_t kMacBytes = 32;  // HMAC-SHA256 (libsodium's)
inline constexpr std::size_t kHelloBytes = 16 + kNonceBytes;
inline constexpr std::size_t kChallengeBytes = 16 + kNonceBytes + kMacBytes;
inline constexpr std::size_t kProofBytes = 4 + kMacBytes;

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

// The credentials (pid, uid) of the process at the other end of a Unix socket.
absl::StatusOr<ucred> PeerCred(int sock);
absl::Status CheckToken(const std::string& token);
// Sets up the HMAC's library (libsodium) once per process; every handshake
// needs it first. kInternal if it cannot be set up.
absl::Status CryptoReady();
// `n` bytes from the kernel's random source.
absl::StatusOr<std::string> RandomBytes(std::size_t n);

// Member side, on a connected socket: checks that process 0 runs as this
// user and knows the token, then sends this process's proof.
// kPermissionDenied when process 0 closes instead (it rejected us) or fails
// to prove it knows the token; kDataLoss for a peer that does not speak the
// protocol. Process 0 may still reject the proof (a duplicate index, say): it
// then closes, which the member's first AllGather reports.
absl::Status MemberHandshake(int sock, int index, const std::string& token, absl::Time deadline);

// Process 0 side, in pure steps so that it can serve many connectors at once
// without blocking on any: parse a complete hello (kHelloBytes) from the
// process `peer_pid`, answer it with a challenge (kChallengeBytes) carrying
// process 0's own proof, and check the member's proof (kProofBytes).
struct Hello {
  int index = -1;
  pid_t pid = 0;
  std::string nonce;  // the member's
};
// kPermissionDenied (naming the reason) unless the hello is well formed, its
// pid is `peer_pid` and its index is in [1, process_count).
absl::StatusOr<Hello> ParseHello(absl::string_view hello, int process_count, pid_t peer_pid);
std::string Challenge(const std::string& token, const Hello& hello, const std::string& nonce);
// kPermissionDenied unless the proof's MAC verifies under `token` for this
// hello and process 0's `nonce`.
absl::Status CheckProof(absl::string_view proof, const std::string& token, const Hello& hello,
                        const std::string& nonce);

}  // namespace wire
}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_WIRE_H_
