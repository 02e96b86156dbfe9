// Across hosts (issue 33): a two-level rendezvous for symmetric groups whose
// processes are on several hosts. docs/symmetric.md ("Across hosts") says
// how to use it.
//
// Level one, per host: the processes of each host rendezvous as on one host
// (MakeUnixSocketExchange or MakeCallbackExchange: SO_PEERCRED, the token's
// challenge-response, FDs over SCM_RIGHTS). Process 0 of each host's
// exchange is that host's leader. Level two: the leaders meet over a
// ByteExchange, which carries bytes only (a TCP connection, or a framework's
// all-gather such as torch.distributed's store): it authenticates no one.
// MakeMultiHostExchange runs the token's mutual challenge-response over it
// (every leader sends a fresh nonce, then an HMAC-SHA256 under the token of
// its index and of every leader's first message, nonces included): across
// hosts the token is the whole proof, and it never crosses the wire. Every
// later leaders' round carries an HMAC under a session key derived from the
// token and that transcript, with the round's number and the sender's
// index, so that nothing injected into the store or the connection is taken
// for a leader's word. FDs never leave their host: a process receives the
// FDs of its own host's processes only, and bytes from everyone.
//
// Contract: the returned Exchange is collective like any other (exchange.h):
// every process calls AllGather the same number of times; one thread at a
// time. Every wait is bounded: the host exchange's timeout bounds each round
// of a host, and the ByteExchange's (TCP: its `timeout`) each leaders'
// round; give the leaders a shorter timeout than the hosts, since a host's
// members wait for their leader's round. A failure anywhere (a wrong token
// on one host, a leader that died, a malformed or unauthenticated message)
// fails the round on every process, naming it; the exchange is then broken
// (kFailedPrecondition on every later round). Received FDs belong to the
// caller. Errors: kInvalidArgument for bad arguments (index, count, token;
// a host exchange and leaders' exchange that do not fit), with no
// state kept; kPermissionDenied when a leader does not prove it knows the
// token or a round's MAC does not verify; kDataLoss for malformed messages;
// kDeadlineExceeded or kUnavailable for members that never came or left.
#ifndef CMA_ALLOCATOR_SYMMETRIC_MULTI_HOST_H_
#define CMA_ALLOCATOR_SYMMETRIC_MULTI_HOST_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "allocator/symmetric/exchange.h"

namespace cma {

// A bytes-only all-gather among `count` parties (the hosts' leaders).
// AllGather is collective; every message is at most kMaxFrameBytes. Not
// authenticated, not thread-safe (one thread at a time).
class ByteExchange {
 public:
  virtual ~ByteExchange() = default;
  virtual int index() const = 0;
  virtual int count() const = 0;
  // Every party's `mine`, in index order.
  virtual absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) = 0;
};

// Over a framework's fixed-size all-gather among the leaders (exchange.h's
// AllGatherCallback): two calls per round, the lengths and then the bytes
// padded to the longest. kInvalidArgument for a null callback or a bad
// index; a failed callback is kUnavailable.
absl::StatusOr<std::unique_ptr<ByteExchange>> MakeCallbackByteExchange(AllGatherCallback callback,
                                                                       void* ctx, int index,
                                                                       int count);

// A TCP listener for party 0 of a TCP ByteExchange, bound before its
// address is published (port 0: any free port; port() says which).
// Move-only; closes its socket unless handed to MakeTcpByteExchangeRoot.
class TcpListener {
 public:
  TcpListener() = default;
  TcpListener(int fd, int port) : fd_(fd), port_(port) {}
  TcpListener(TcpListener&& o) noexcept : fd_(o.fd_), port_(o.port_) { o.fd_ = -1; }
  TcpListener& operator=(TcpListener&& o) noexcept;
  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;
  ~TcpListener();
  int port() const { return port_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// `host`: a numeric IPv4 or IPv6 address ("127.0.0.1", "::1", "0.0.0.0").
// kInvalidArgument for a bad address or port; kUnavailable if it cannot bind.
absl::StatusOr<TcpListener> ListenTcp(const std::string& host, int port);

// Party 0: accepts the other count - 1 parties on `listener` within
// `timeout`. Each connector must answer a challenge under `token` (the
// rendezvous token: a fresh nonce from party 0, then the connector's index,
// count and own fresh nonce with an HMAC of them and both nonces; party 0
// answers with its own HMAC of the same, so each side knows the other knows
// the token, in this hello: an ack recorded from another hello, even one
// offering the same nonce of party 0, does not verify) before it takes a
// slot. Anyone who reaches the port can connect, so party 0 accepts every
// connection waiting (a backlog of 4096, capped by net.core.somaxconn),
// challenges it at once and serves every connector's hello together, each
// within 1 s, at most 256 at once: past that, or past its second, a
// connection not yet judged is dropped with a busy notice (which proves
// nothing), the oldest first; one whose hello does not verify is closed
// without a word and the wait goes on. Each later round is bounded by
// `timeout` too, and by 64 MiB in all. The others connect to `host`:`port`,
// retrying until `timeout` while party 0 does not listen yet, or drops
// them busy, or closes before challenging them (so a flood of connections
// delays a party by a few round trips); one that party 0 closes once it
// has its hello gets kUnavailable at once (party 0's error says why); an
// ack without party 0's proof is kPermissionDenied. kDeadlineExceeded
// naming the parties that never came (party 0) or the attempts (the
// others). The hello does not encrypt: the rounds' bytes are in the clear.
absl::StatusOr<std::unique_ptr<ByteExchange>> MakeTcpByteExchangeRoot(TcpListener listener,
                                                                      int count,
                                                                      absl::Duration timeout,
                                                                      const std::string& token);
absl::StatusOr<std::unique_ptr<ByteExchange>> MakeTcpByteExchange(const std::string& host,
                                                                  int port, int index, int count,
                                                                  absl::Duration timeout,
                                                                  const std::string& token);

// The two-level exchange. `host`: this host's exchange (its process 0 is
// the leader); `leaders`: the leaders' ByteExchange on the leader, null on
// every other process. `process_index` and `process_count` are global (the
// group's process order); every process of every host passes the same
// count and `token` (which the launcher gives every process; it must pass
// the token rule of exchange.h). Every process proves the token to every
// other process of its host (a MAC over every process's fresh nonce), and
// the leaders to each other, so every process is authenticated by the
// launcher's token whatever token its host exchange ran on (with one host
// too); a process with another token fails the set-up on every process of
// every host (kPermissionDenied on its host, naming it; kAborted on the
// others, whose leaders heard its leader refuse). Set-up is collective: it
// takes three rounds of each host exchange and three leaders' rounds (the proof and its
// verdict, MAC'd under the token; a refusal, like an ok, is bound to this
// set-up: to its sender's fresh nonce), and fails on every process, naming
// the cause, if any leader does not prove it knows the token or the hosts'
// processes are not exactly 0..count-1. Each AllGather then costs two rounds of the host exchange and
// two leaders' rounds (the data, then every leader's verdict on it, MAC'd:
// a leader accepts a round only if every leader did, so a message altered
// on its way to one leader fails the round on every host). host_count() and
// host_of() say where each process is.
absl::StatusOr<std::unique_ptr<Exchange>> MakeMultiHostExchange(
    std::unique_ptr<Exchange> host, std::unique_ptr<ByteExchange> leaders, int process_index,
    int process_count, const std::string& token);

}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_MULTI_HOST_H_
