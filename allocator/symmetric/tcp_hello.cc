// The TCP ByteExchange's hello (multi_host.h): party 0 admitting the other
// parties that prove the token, and a party connecting to it.
//
// Anyone who reaches the port can connect, so party 0 spends little on a
// connection that has not proved itself: it accepts everything waiting
// (a large backlog, drained at every wake), challenges each connection at
// once, gives each kConnectorTime to answer, and holds at most kMaxPending
// at a time, dropping the oldest to make room. A dropped connection is
// told so (a busy notice, which proves nothing), and its connector tries
// again until its own deadline: a flood delays a real party by a few
// round trips, not by the flood's length. A connection whose hello does not
// verify (a wrong token, an index taken, another count) is closed without
// a word, and its connector fails at once (kUnavailable: party 0's error
// says why).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/symmetric/multi_host.h"
#include "allocator/symmetric/socket_rendezvous.h"
#include "allocator/symmetric/tcp_internal.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace {

using namespace tcp_internal;  // NOLINT: this file's own helpers

// A connection's time to answer the challenge: a real party answers within
// a round trip.
constexpr absl::Duration kConnectorTime = absl::Seconds(1);
// Connections in their hello at once; past that the oldest is dropped.
constexpr std::size_t kMaxPending = 256;
// Connections accepted per wake, so that the pending ones are read between
// batches of a flood.
constexpr int kAcceptBatch = 64;

std::string Busy() {
  std::string out;
  Put(out, kTcpBusyMagic);
  Put(out, kTcpVersion);
  return out;
}

// Party 0 drops a connection it has not judged: the busy notice, then a
// close that is a FIN, not a reset (whatever the connector sent is read
// first), so that the notice arrives.
void DropUnjudged(int fd) {
  const std::string busy = Busy();
  (void)send(fd, busy.data(), busy.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  // One bounded read (a real connector sends one hello at most): a loop
  // would let a peer that keeps sending hold party 0 past its deadline.
  char sink[kTcpHello];
  (void)recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
  shutdown(fd, SHUT_WR);
  close(fd);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteExchange>> MakeTcpByteExchangeRoot(TcpListener listener,
                                                                      int count,
                                                                      absl::Duration timeout,
                                                                      const std::string& token) {
  if (absl::Status s = CheckParty(0, count); !s.ok()) return s;
  if (absl::Status s = rendezvous::CheckTimeout(timeout); !s.ok()) return s;
  if (absl::Status s = wire::CheckToken(token); !s.ok()) return s;
  if (absl::Status s = wire::CryptoReady(); !s.ok()) return s;
  const int l = listener.release();
  if (l < 0) return absl::InvalidArgumentError("leaders' exchange: no listener");
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> peers(count, -1);
  // Connectors still in their hello, served together (poll), each within
  // its own deadline: a silent one holds a pending slot, not the root.
  struct Pending {
    int fd;
    absl::Time by;
    std::string nonce;
    std::string got;
  };
  std::vector<Pending> pending;
  int rejected = 0, dropped = 0, in = 1;
  auto reject = [&](std::size_t k) {  // judged: a hello that does not verify
    ++rejected;
    close(pending[k].fd);
    pending.erase(pending.begin() + k);
  };
  auto drop = [&](std::size_t k) {  // not judged: too slow, or room was needed
    ++dropped;
    DropUnjudged(pending[k].fd);
    pending.erase(pending.begin() + k);
  };
  while (in < count) {
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    for (std::size_t k = pending.size(); k-- > 0;) {
      if (now >= pending[k].by) drop(k);
    }
    std::vector<pollfd> fds{{l, POLLIN, 0}};
    absl::Time wake = deadline;
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      wake = std::min(wake, p.by);
    }
    const int ms = static_cast<int>(
        std::max<std::int64_t>(1, absl::ToInt64Milliseconds(wake - now) + 1));
    const int r = poll(fds.data(), fds.size(), std::min(ms, 1000));
    if (r < 0 && errno != EINTR) {
      absl::Status s = wire::Errno("leaders' exchange: poll");
      for (Pending& p : pending) close(p.fd);
      close(l);
      wire::CloseAll(peers);
      return s;
    }
    if (r <= 0) continue;
    // The pending ones first (from the back, as they may go).
    for (std::size_t f = fds.size(); f-- > 1;) {
      const std::size_t k = f - 1;
      if (fds[f].revents == 0) continue;
      Pending& p = pending[k];
      char buf[kTcpHello];
      const ssize_t n = recv(p.fd, buf, kTcpHello - p.got.size(), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        reject(k);
        continue;
      }
      p.got.append(buf, n);
      if (p.got.size() < kTcpHello) continue;
      const char* h = p.got.data();
      const auto index = At<std::int32_t>(h + 8);
      const std::string nonces = p.nonce + std::string(h + 16, wire::kNonceBytes);  // Nr Nc
      if (At<std::uint32_t>(h) != kTcpHelloMagic || At<std::uint32_t>(h + 4) != kTcpVersion ||
          At<std::int32_t>(h + 12) != count ||
          !TcpMacOk(h + 16 + wire::kNonceBytes, TcpMac(token, "cma-tcph", index, count, nonces)) ||
          index < 1 || index >= count || peers[index] >= 0) {
        reject(k);
        continue;
      }
      std::string ack;
      Put(ack, kTcpHelloMagic);
      Put(ack, kTcpVersion);
      ack += TcpMac(token, "cma-tcpa", index, count, nonces);
      if (!wire::WriteAll(p.fd, ack.data(), ack.size(), p.by, "a connector").ok()) {
        reject(k);
        continue;
      }
      peers[index] = p.fd;
      pending.erase(pending.begin() + k);
      ++in;
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    for (int batch = 0; batch < kAcceptBatch && in < count; ++batch) {
      const int c = accept4(l, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) break;  // EAGAIN (none left), ECONNABORTED, EMFILE: wait again
      NoDelay(c);
      if (pending.size() >= kMaxPending) drop(0);  // the oldest: the longest silent
      absl::StatusOr<std::string> nonce = wire::RandomBytes(wire::kNonceBytes);
      std::string challenge;
      Put(challenge, kTcpHelloMagic);
      Put(challenge, kTcpVersion);
      if (!nonce.ok()) {
        ++dropped;
        DropUnjudged(c);
        continue;
      }
      challenge += *nonce;
      // A fresh socket's buffer takes the whole challenge: a short send
      // means the connector is gone already.
      if (send(c, challenge.data(), challenge.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
          static_cast<ssize_t>(challenge.size())) {
        ++dropped;
        close(c);
        continue;
      }
      pending.push_back({c, std::min(deadline, absl::Now() + kConnectorTime), *nonce,
                         std::string()});
    }
  }
  for (Pending& p : pending) DropUnjudged(p.fd);
  close(l);
  if (in < count) {
    std::vector<int> missing;
    for (int k = 1; k < count; ++k) {
      if (peers[k] < 0) missing.push_back(k);
    }
    wire::CloseAll(peers);
    return absl::DeadlineExceededError(absl::StrFormat(
        "leaders' exchange: timed out waiting for leaders to connect (never came: leader%s %s; "
        "%d connection(s) turned away, %d dropped before their hello was complete)",
        missing.size() > 1 ? "s" : "", absl::StrJoin(missing, ", "), rejected, dropped));
  }
  return NewTcpByteExchange(0, count, timeout, std::move(peers));
}

namespace {

// One connection's hello (the connector's side). kUnavailable with
// `retry` set: party 0 dropped us before judging our hello (busy), or the
// connection went before its challenge; try again. Other errors are final.
absl::StatusOr<int> HelloOnce(const sockaddr_storage& addr, socklen_t len, int index, int count,
                              const std::string& token, absl::Time deadline,
                              const std::string& who, bool* retry) {
  *retry = false;
  const int c = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (c < 0) return wire::Errno("socket");
  auto fail = [&](absl::Status s, bool again) -> absl::Status {
    close(c);
    *retry = again;
    return s;
  };
  int err = 0;
  if (connect(c, reinterpret_cast<const sockaddr*>(&addr), len) != 0) err = errno;
  if (err == EINPROGRESS) {
    if (absl::Status s = wire::WaitFor(c, POLLOUT, deadline, who); !s.ok()) return fail(s, false);
    socklen_t el = sizeof(err);
    if (getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
  }
  if (err != 0) {
    // Not listening yet, or a connection lost on the way: again.
    const bool again = err == ECONNREFUSED || err == EINTR || err == EAGAIN ||
                       err == ETIMEDOUT || err == ECONNRESET;
    errno = err;
    return fail(wire::Errno(absl::StrCat("leaders' exchange: connect to ", who)), again);
  }
  NoDelay(c);
  // The challenge, or a busy notice in its place.
  char challenge[kTcpChallenge], ack[kTcpAck];
  absl::Status s = wire::ReadAll(c, challenge, 8, deadline, who);
  if (absl::IsUnavailable(s)) return fail(s, true);  // closed before challenging us
  if (!s.ok()) return fail(s, false);
  if (At<std::uint32_t>(challenge) == kTcpBusyMagic) {
    return fail(absl::UnavailableError(absl::StrCat("leaders' exchange: ", who, " was busy")),
                true);
  }
  if (At<std::uint32_t>(challenge) != kTcpHelloMagic ||
      At<std::uint32_t>(challenge + 4) != kTcpVersion) {
    return fail(absl::DataLossError(absl::StrCat(
                    "leaders' exchange: ", who, " is not a cma leaders' exchange of this version")),
                false);
  }
  s = wire::ReadAll(c, challenge + 8, kTcpChallenge - 8, deadline, who);
  if (!s.ok()) return fail(s, absl::IsUnavailable(s));
  // Nr, the root's; then Nc, this connector's own, fresh for this hello.
  std::string nonces(challenge + 8, wire::kNonceBytes);
  absl::StatusOr<std::string> mine = wire::RandomBytes(wire::kNonceBytes);
  if (!mine.ok()) return fail(mine.status(), false);
  nonces += *mine;
  std::string hello;
  Put(hello, kTcpHelloMagic);
  Put(hello, kTcpVersion);
  Put(hello, static_cast<std::int32_t>(index));
  Put(hello, static_cast<std::int32_t>(count));
  hello += *mine;
  hello += TcpMac(token, "cma-tcph", index, count, nonces);
  s = wire::WriteAll(c, hello.data(), hello.size(), deadline, who);
  if (s.ok()) s = wire::ReadAll(c, ack, 8, deadline, who);
  if (s.ok() && At<std::uint32_t>(ack) == kTcpBusyMagic) {
    // Dropped before our hello was judged (it was too slow, or room was
    // needed): again.
    return fail(absl::UnavailableError(absl::StrCat("leaders' exchange: ", who, " was busy")),
                true);
  }
  if (s.ok()) s = wire::ReadAll(c, ack + 8, kTcpAck - 8, deadline, who);
  if (absl::IsUnavailable(s)) {
    // Closed without a notice once it had our hello: judged and refused.
    // What the root disliked it does not say (a wrong token, an index
    // taken, another count, or a hello too late): its error says.
    return fail(absl::UnavailableError(absl::StrFormat(
                    "leaders' exchange: %s closed the connection before acknowledging this "
                    "leader's hello (leader %d of %d); leader 0's error says why",
                    who, index, count)),
                false);
  }
  if (s.ok() && (At<std::uint32_t>(ack) != kTcpHelloMagic ||
                 At<std::uint32_t>(ack + 4) != kTcpVersion ||
                 !TcpMacOk(ack + 8, TcpMac(token, "cma-tcpa", index, count, nonces)))) {
    s = absl::PermissionDeniedError(absl::StrCat(
        "leaders' exchange: ", who, " did not prove that it knows the rendezvous token"));
  }
  if (!s.ok()) return fail(s, false);
  return c;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ByteExchange>> MakeTcpByteExchange(const std::string& host,
                                                                  int port, int index, int count,
                                                                  absl::Duration timeout,
                                                                  const std::string& token) {
  if (absl::Status s = CheckParty(index, count); !s.ok()) return s;
  if (index == 0) {
    return absl::InvalidArgumentError(
        "leaders' exchange: party 0 listens (MakeTcpByteExchangeRoot), it does not connect");
  }
  if (absl::Status s = rendezvous::CheckTimeout(timeout); !s.ok()) return s;
  if (absl::Status s = wire::CheckToken(token); !s.ok()) return s;
  if (absl::Status s = wire::CryptoReady(); !s.ok()) return s;
  sockaddr_storage addr;
  socklen_t len = 0;
  if (absl::Status s = ParseAddress(host, port, &addr, &len); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  const std::string who = absl::StrFormat("leader 0 at %s:%d", host, port);
  // Every attempt until the deadline: party 0 not listening yet, or busy
  // (a flood), costs a retry, not the set-up.
  absl::Duration pause = absl::Milliseconds(10);
  int attempts = 0;
  absl::Status last;
  for (;;) {
    bool retry = false;
    ++attempts;
    absl::StatusOr<int> c = HelloOnce(addr, len, index, count, token, deadline, who, &retry);
    if (c.ok()) {
      std::vector<int> peers(count, -1);
      peers[0] = *c;
      return NewTcpByteExchange(index, count, timeout, std::move(peers));
    }
    if (!retry) return c.status();
    last = c.status();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "leaders' exchange: %s never admitted this leader within the timeout (%d attempt%s; "
          "the last: %s)",
          who, attempts, attempts > 1 ? "s" : "", last.message()));
    }
    absl::SleepFor(std::min(left, pause));
    pause = std::min(pause * 2, absl::Milliseconds(250));
  }
}

}  // namespace cma
