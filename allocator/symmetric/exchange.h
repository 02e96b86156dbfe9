// Exchange: how the processes of a symmetric group rendezvous. One call,
// AllGather, gives every process every process's contribution: a few bytes
// of metadata plus file descriptors (exported VMM handles).
//
// Implementations: SingleProcessExchange (all members in one process: no
// communication), UnixSocketExchange (processes on one host; FDs cross with
// SCM_RIGHTS), and MakeCallbackExchange (a framework's own communicator,
// such as torch.distributed or MPI, bootstraps a UnixSocketExchange).
//
// Security of the socket rendezvous: only processes of the same user that
// know the rendezvous token get in, and members talk only to a process 0
// that knows it. Process 0 checks every connector's peer credentials
// (SO_PEERCRED: same effective uid) and then runs a mutual HMAC-SHA256
// challenge-response with it (wire.h): the token itself never crosses the
// socket, and each side checks that the pid its peer's MAC covers is the
// pid SO_PEERCRED reports (no relaying); so the members must share one pid
// namespace (processes in containers that share only the socket's directory
// are refused as relays). A rejected connector is closed
// having received at most a random challenge and, if its hello was a
// member's, the reason (its index is taken, its proof does not verify); the
// rendezvous goes on waiting for the real member (an intruder cannot claim
// an index or abort it). Process 0 reads every pending connector at once, each with its own
// 2 s deadline and at most 64 pending, so silent connectors cannot hold the
// real members up. Members connect without blocking (a full backlog times
// out like a missing process 0). The socket file is made 0600 in a
// directory others cannot write to (or a sticky one, such as /tmp); the
// callback bootstrap uses no file at all but a random abstract socket name
// that process 0 binds before publishing it, with its pid, which members
// check. Frame sizes are bounded before anything is allocated.
//
// Process 0 welcomes the members only once all are in. A member's
// MakeUnixSocketExchange returns once it has proved itself; its first
// AllGather gets process 0's first round, which is the welcome (so that it
// costs no message), or process 0's reason when the rendezvous did not
// complete: the
// processes that never connected (kDeadlineExceeded), a member that left
// (kUnavailable), this member's rejection (kPermissionDenied). A process 0
// that goes away is kUnavailable saying so, never a rejection.
//
// Contract: AllGather is collective; every process calls it the same number
// of times. Every wait is bounded by the exchange's timeout: a process that
// dies or never arrives gives the others kDeadlineExceeded or kUnavailable
// naming it, never a hang. Received FDs belong to the caller (close them).
// An Exchange is used by one thread at a time.
#ifndef CMA_ALLOCATOR_SYMMETRIC_EXCHANGE_H_
#define CMA_ALLOCATOR_SYMMETRIC_EXCHANGE_H_

#include <cstddef>
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
  // Where the processes are (multi_host.h): hosts are numbered 0 to
  // host_count() - 1, and FDs reach only the processes of the sender's
  // host. Every exchange of one host says 1 and 0.
  virtual int host_count() const { return 1; }
  virtual int host_of(int /*process*/) const { return 0; }
};

// Every member in this process: AllGather returns the caller's contribution
// (with dup'ed FDs, so ownership rules are the same as for other exchanges).
std::unique_ptr<Exchange> MakeSingleProcessExchange();

// A fresh random rendezvous token (64 hex characters from the kernel's
// random source, drawn again in the rare case that it fails the token rule
// below), for the bootstrap to hand to every member. This is the way to
// make a token.
absl::StatusOr<std::string> MakeRendezvousToken();

// Processes on one host meet at a Unix socket path; process 0 listens there.
// Every member passes the same `token`; a bootstrap (MakeCallbackExchange,
// MPI, torch.distributed) distributes it. Process 0 answers any same-user
// hello with a MAC under the token, so a weak token can be guessed offline:
// it must carry 128 bits. The rule (token_rule.cc): kMinTokenBytes to
// kMaxTokenBytes hex digits (either case; 4 bits each at most), and none of
// what people make by hand: at least 3/4 of its 3-digit substrings
// distinct, no 8 digits occurring twice (9 past 64 digits), at most 2/3 of
// its adjacent digits equal or consecutive, hexspeak words (dead, beef,
// cafe, f00d, ...) covering less than 3/8 of it, not the hex of text
// (every byte printable once trailing NULs are dropped, or 2^21 times
// likelier under a model of typed text, with UTF-8 and Latin-1 letters and
// odd control bytes, than as random bytes), at least 2.5 bits per digit in
// its digits' histogram (not a few digits reused), no digit fixed every
// 2nd, 3rd or 4th position, and no counting ("1a2b3c...": the digits of
// every 2nd or 3rd position stepping by one amount, or of two of every
// 4th). These screens refuse what people make by hand, not every guessable
// token; the hex of text is also looked for one digit off its byte
// boundaries and backwards, and a token of decimal digits only needs 39 of
// them. A random token fails them with probability about 1e-6 at most: at
// 32 digits about 1.1e-6 by the sum of each screen's bound (2e8 random
// tokens drew 3.4e-7 before the shifted, backwards and decimal screens),
// at 64 (MakeRendezvousToken's) and 128 digits below 1e-6, mostly pieces
// that repeat by chance; a refusal
// names the screen and never echoes the token. Make it with
// MakeRendezvousToken (or secrets.token_hex(32), openssl rand -hex 32).
// `timeout` bounds connection set-up and every AllGather.
// kInvalidArgument for a bad index, path, token or timeout (not in
// (0, kMaxExchangeTimeout]); kPermissionDenied when process 0 is another
// user, rejected this process or failed to prove it knows the token, or when
// the socket's directory is writable by others (and not sticky);
// kDeadlineExceeded naming the processes that never connected (and any
// connections rejected); kUnavailable when process 0 went away, or (on
// process 0) a member left before everyone was in.
// An existing file at `path` that is not a socket is never removed, nor a
// socket something listens on (kAlreadyExists); a stale socket is replaced.
absl::StatusOr<std::unique_ptr<Exchange>> MakeUnixSocketExchange(const std::string& path,
                                                                  int process_index,
                                                                  int process_count,
                                                                  absl::Duration timeout,
                                                                  const std::string& token);

// The longest exchange timeout accepted: an infinite or enormous timeout is
// kInvalidArgument, because every wait must end in an error naming a dead
// member rather than a hang.
inline constexpr absl::Duration kMaxExchangeTimeout = absl::Hours(24);

// Limits of the wire protocol, checked before anything is allocated.
inline constexpr std::size_t kMaxFrameBytes = std::size_t{1} << 20;
inline constexpr std::size_t kMinTokenBytes = 32;  // hex digits: 128 bits
inline constexpr std::size_t kMaxTokenBytes = 128;

// A framework's all-gather of fixed-size byte buffers: `send` (len bytes)
// from every rank lands in `recv` (count * len bytes, rank order). Returns 0
// on success.
using AllGatherCallback = int (*)(void* ctx, const void* send, size_t len, void* recv);

// Uses `callback` once, to hand every member process 0's socket name, a
// fresh token and process 0's pid, then exchanges through a
// UnixSocketExchange (FDs cannot travel through a framework's
// communicator). The socket is in Linux's abstract namespace (so every
// member must share process 0's network namespace as well as its pid
// namespace): it has no file, so a process 0 that is killed leaves nothing
// behind, and process 0 holds the name from before it is published. A
// member refuses a listener whose pid is not the published one
// (kPermissionDenied). The index, count and timeout are checked as above;
// kUnavailable if the callback fails, and, at once rather than at the
// timeout, when the published process 0 exits before it lets this member
// in (a member watches its pid while it waits to connect).
absl::StatusOr<std::unique_ptr<Exchange>> MakeCallbackExchange(AllGatherCallback callback,
                                                               void* ctx, int process_index,
                                                               int process_count,
                                                               absl::Duration timeout);

}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_EXCHANGE_H_
