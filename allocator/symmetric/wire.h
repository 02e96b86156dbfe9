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
// The welcome is process 0's first round of frames (process 0 gathers only
// once every member is in): it costs no message of its own. In its place,
// process 0 may send a verdict, the reason it ends the rendezvous for this
// member, the same size as a frame header:
//   process 0 -> member:  verdict    {magic, version, status code, reason length, reason}
// instead of a challenge or of the welcome: a rejection (its index is taken,
// its proof does not verify) or a failed rendezvous (who never connected).
// In place of a challenge, process 0 has proved nothing yet, and whoever
// holds the socket's path could answer; so that verdict is signed (its
// own magic, so that a member never waits for a MAC that is not coming):
//                                    {..., reason, HMAC-SHA256(token, "cma-verd" version
//                                                 index pid0 nonce1 code reason)}
// and a member takes one whose MAC does not verify as an impostor
// (kPermissionDenied), never as its claim. A verdict in place of the
// welcome needs no MAC: it comes on the connection whose peer already
// proved it is process 0 (its MAC, and SO_PEERCRED naming the same pid).
// So a member tells a rejection from a process 0 that went away (a closed
// connection without a verdict). Connectors that do not speak the protocol,
// or relay another process's hello, get nothing.
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
inline constexpr std::size_t kVerdictHeaderBytes = 16;
inline constexpr std::size_t kMaxReasonBytes = 512;  // longer reasons are cut

// HMAC-SHA256 of `msg` under `key` (kMacBytes); "" (which matches no MAC)
// if libsodium fails.
std::string HmacSha256(absl::string_view key, absl::string_view msg);
// Whether `got` is exactly the MAC `want`, compared in constant time.
bool MacMatches(absl::string_view got, const std::string& want);

void CloseAll(std::vector<int>& fds);
// Shuts down and closes every open socket of `fds` and marks it -1, so that
// the peers see a disconnect at once rather than wait out their timeout.
void ShutdownAll(std::vector<int>& fds);
absl::Status Errno(const std::string& what);
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& who);
absl::Status WriteAll(int fd, const void* data, std::size_t n, absl::Time deadline,
                      const std::string& who);
absl::Status ReadAll(int fd, void* data, std::size_t n, absl::Time deadline,
                     const std::string& who);

// One frame: a header (carrying the FDs) then the bytes. `ok` false sends an
// error frame whose bytes are the reason (the receiver gets kAborted).
// RecvFrame returns a verdict received in place of a frame as its status.
absl::Status SendFrame(int sock, bool ok, const Contribution& c, absl::Time deadline,
                       const std::string& who);
absl::StatusOr<Contribution> RecvFrame(int sock, absl::Time deadline, const std::string& who);

// The credentials (pid, uid) of the process at the other end of a Unix socket.
absl::StatusOr<ucred> PeerCred(int sock);
// exchange.h's token rule: kInvalidArgument naming what is wrong.
absl::Status CheckToken(const std::string& token);
// Sets up the HMAC's library (libsodium) once per process; every handshake
// needs it first. kInternal if it cannot be set up.
absl::Status CryptoReady();
// `n` bytes from the kernel's random source.
absl::StatusOr<std::string> RandomBytes(std::size_t n);

// Member side, on a connected socket: checks that process 0 runs as this
// user and knows the token, then sends this process's proof.
// kPermissionDenied when process 0 rejects us (its verdict's reason) or fails
// to prove it knows the token; kUnavailable when process 0 closes without a
// word (it exited or was killed); kDataLoss for a peer that does not speak
// the protocol. Process 0's verdict on the proof comes with its first
// round (RecvFrame).
absl::Status MemberHandshake(int sock, int index, const std::string& token, absl::Time deadline);

// Process 0's verdict for a member: the failed `status`'s code and message
// (cut to kMaxReasonBytes).
std::string Verdict(const absl::Status& status);
struct Hello;
// The verdict on a member's `hello`, sent in place of the challenge:
// Verdict's bytes and process 0's MAC over them.
std::string SignedVerdict(const absl::Status& status, const std::string& token,
                          const Hello& hello);
// A member's error for a process 0 (`pid`) that closed without a verdict.
absl::Status ProcessZeroLeft(pid_t pid, absl::string_view when);
// How long past its own timeout a member waits for the welcome: process 0
// gives its verdict at its own deadline, which comes first but by as little
// as a connection's set-up, so a loaded host could let the member's pass
// first and lose the reason.
inline constexpr absl::Duration kVerdictGrace = absl::Seconds(1);

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
