// ByteExchange implementations (multi_host.h): over TCP (party 0 relays every
// round, like a store) and over a framework's fixed-size all-gather. Bytes
// only, not authenticated: MakeMultiHostExchange authenticates on top. Every
// byte read is hostile: sizes are bounded before anything is allocated,
// versions checked, and every read and write has a deadline.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sodium.h>
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
#include "allocator/symmetric/wire.h"

namespace cma {
namespace {

constexpr std::uint32_t kTcpHelloMagic = 0x434d4154;  // "CMAT"
constexpr std::uint32_t kTcpFrameMagic = 0x434d4142;  // "CMAB"
constexpr std::uint32_t kTcpVersion = 3;
constexpr absl::Duration kConnectorTime = absl::Seconds(2);
// Connections accepted but not yet through the hello: at most this many at
// once (the others wait in the listen backlog), each for kConnectorTime.
constexpr std::size_t kMaxPending = 64;
// The hello, as a mutual challenge-response under the rendezvous token,
// each side with its own fresh nonce (Nr: the root's, Nc: the connector's):
//   root -> connector: {magic, version, Nr}                     (challenge)
//   connector -> root: {magic, version, index, count, Nc,
//                       HMAC(token, "cma-tcph" version index count Nr Nc)}
//   root -> connector: {magic, version,
//                       HMAC(token, "cma-tcpa" version index count Nr Nc)}
// The ack names Nc, which the connector drew for this hello alone: a
// recorded ack does not verify in another hello, even one offering the
// same Nr (a fake root replaying a real root's challenge).
constexpr std::size_t kTcpMac = crypto_auth_hmacsha256_BYTES;
constexpr std::size_t kTcpChallenge = 8 + wire::kNonceBytes;
constexpr std::size_t kTcpHello = 16 + wire::kNonceBytes + kTcpMac;
constexpr std::size_t kTcpAck = 8 + kTcpMac;
// Frames are read as their bytes come, this much at a time: an announced
// length is not memory until the bytes are there.
constexpr std::size_t kReadChunk = std::size_t{64} << 10;
// A round moves count * kMaxFrameBytes at most: count is bounded, and so is
// what one round may bring in all (a hostile peer cannot make us hold more).
constexpr int kMaxParties = 4096;
constexpr std::size_t kMaxRoundBytes = std::size_t{64} << 20;

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}
template <typename T>
T At(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// `nonces`: Nr then Nc (each kNonceBytes).
std::string TcpMac(const std::string& token, const char* label, std::int32_t index,
                   std::int32_t count, const std::string& nonces) {
  std::string msg = label;
  Put(msg, kTcpVersion);
  Put(msg, index);
  Put(msg, count);
  msg += nonces;
  return wire::HmacSha256(token, msg);
}
bool TcpMacOk(const char* got, const std::string& want) {
  return wire::MacMatches(absl::string_view(got, kTcpMac), want);
}

absl::Status CheckParty(int index, int count) {
  if (count < 1 || count > kMaxParties || index < 0 || index >= count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "leaders' exchange: party %d of %d is not valid (at most %d parties)", index, count,
        kMaxParties));
  }
  return absl::OkStatus();
}

// Socket address of a numeric IPv4 or IPv6 host.
absl::Status ParseAddress(const std::string& host, int port, sockaddr_storage* out,
                          socklen_t* len) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat("leaders' exchange: bad port %d", port));
  }
  std::memset(out, 0, sizeof(*out));
  auto* v4 = reinterpret_cast<sockaddr_in*>(out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    *len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    *len = sizeof(*v6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "leaders' exchange: '", host, "' is not a numeric IPv4 or IPv6 address"));
  }
  return absl::OkStatus();
}

void NoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// One frame: {magic, seq, ok, length} then the bytes. ok 0: the bytes are
// the sender's reason for failing the round.
absl::Status SendFrame(int fd, std::uint32_t seq, bool ok, const std::string& bytes,
                       absl::Time deadline, const std::string& who) {
  std::string h;
  Put(h, kTcpFrameMagic);
  Put(h, seq);
  Put(h, static_cast<std::uint32_t>(ok));
  Put(h, static_cast<std::uint32_t>(bytes.size()));
  if (absl::Status s = wire::WriteAll(fd, h.data(), h.size(), deadline, who); !s.ok()) return s;
  return wire::WriteAll(fd, bytes.data(), bytes.size(), deadline, who);
}

absl::StatusOr<std::string> RecvFrame(int fd, std::uint32_t seq, absl::Time deadline,
                                      const std::string& who) {
  char h[16];
  if (absl::Status s = wire::ReadAll(fd, h, sizeof(h), deadline, who); !s.ok()) return s;
  const auto magic = At<std::uint32_t>(h), their_seq = At<std::uint32_t>(h + 4),
             ok = At<std::uint32_t>(h + 8), len = At<std::uint32_t>(h + 12);
  if (magic != kTcpFrameMagic || their_seq != seq || ok > 1 || len > kMaxFrameBytes) {
    return absl::DataLossError(absl::StrFormat(
        "leaders' exchange: malformed frame from %s (magic %#x, round %d of %d expected, ok %d, "
        "%d bytes; limit %d)",
        who, magic, their_seq, seq, ok, len, kMaxFrameBytes));
  }
  std::string bytes;
  while (bytes.size() < len) {  // grows as the bytes come, not as announced
    const std::size_t at = bytes.size(), n = std::min<std::size_t>(kReadChunk, len - at);
    bytes.resize(at + n);
    if (absl::Status s = wire::ReadAll(fd, bytes.data() + at, n, deadline, who); !s.ok()) return s;
  }
  if (ok == 0) {
    bytes.resize(std::min<std::size_t>(bytes.size(), wire::kMaxReasonBytes));
    return absl::AbortedError(absl::StrCat("leaders' exchange failed at ", who, ": ", bytes));
  }
  return bytes;
}

class TcpByteExchange final : public ByteExchange {
 public:
  TcpByteExchange(int index, int count, absl::Duration timeout, std::vector<int> peers)
      : index_(index), count_(count), timeout_(timeout), peers_(std::move(peers)) {}
  ~TcpByteExchange() override { wire::CloseAll(peers_); }
  int index() const override { return index_; }
  int count() const override { return count_; }

  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) override {
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "leaders' exchange: an earlier round failed (", broken_.message(), ")"));
    }
    if (mine.size() > kMaxFrameBytes) {
      return absl::InvalidArgumentError("leaders' exchange: a message over kMaxFrameBytes");
    }
    const absl::Time deadline = absl::Now() + timeout_;
    const std::uint32_t seq = ++seq_;
    absl::StatusOr<std::vector<std::string>> out =
        index_ == 0 ? Root(mine, seq, deadline) : Member(mine, seq, deadline);
    if (!out.ok()) {
      broken_ = out.status();
      wire::ShutdownAll(peers_);
    }
    return out;
  }

 private:
  absl::StatusOr<std::vector<std::string>> Root(const std::string& mine, std::uint32_t seq,
                                                absl::Time deadline) {
    std::vector<std::string> all(count_);
    all[0] = mine;
    absl::Status failure;
    // Every party's message in before anything goes out; the round's total
    // is bounded here as at the members.
    std::size_t total = mine.size();
    for (int i = 1; i < count_ && failure.ok(); ++i) {
      absl::StatusOr<std::string> got =
          RecvFrame(peers_[i], seq, deadline, absl::StrCat("leader ", i));
      if (got.ok()) {
        total += got->size();
        all[i] = std::move(*got);
        if (total > kMaxRoundBytes) {
          failure = absl::DataLossError(absl::StrFormat(
              "leaders' exchange: round %d exceeds %d bytes in all (at leader %d)", seq,
              kMaxRoundBytes, i));
        }
      } else {
        failure = got.status();
      }
    }
    for (int i = 1; i < count_; ++i) {
      const std::string who = absl::StrCat("leader ", i);
      if (!failure.ok()) {
        (void)SendFrame(peers_[i], seq, false, std::string(failure.message()), deadline, who);
        continue;
      }
      for (int j = 0; j < count_ && failure.ok(); ++j) {
        failure = SendFrame(peers_[i], seq, true, all[j], deadline, who);
      }
    }
    if (!failure.ok()) return failure;
    return all;
  }

  absl::StatusOr<std::vector<std::string>> Member(const std::string& mine, std::uint32_t seq,
                                                  absl::Time deadline) {
    if (absl::Status s = SendFrame(peers_[0], seq, true, mine, deadline, "leader 0"); !s.ok()) {
      return s;
    }
    std::vector<std::string> all;
    std::size_t total = 0;
    for (int j = 0; j < count_; ++j) {
      absl::StatusOr<std::string> got = RecvFrame(peers_[0], seq, deadline, "leader 0");
      if (!got.ok()) return got.status();
      total += got->size();
      if (total > kMaxRoundBytes) {
        return absl::DataLossError(absl::StrFormat(
            "leaders' exchange: leader 0's round exceeds %d bytes in all", kMaxRoundBytes));
      }
      all.push_back(std::move(*got));
    }
    return all;
  }

  const int index_;
  const int count_;
  const absl::Duration timeout_;
  std::vector<int> peers_;  // party 0: one per party; others: peers_[0]
  std::uint32_t seq_ = 0;
  absl::Status broken_;
};

class CallbackByteExchange final : public ByteExchange {
 public:
  CallbackByteExchange(AllGatherCallback callback, void* ctx, int index, int count)
      : callback_(callback), ctx_(ctx), index_(index), count_(count) {}
  int index() const override { return index_; }
  int count() const override { return count_; }

  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) override {
    if (mine.size() > kMaxFrameBytes) {
      return absl::InvalidArgumentError("leaders' exchange: a message over kMaxFrameBytes");
    }
    const std::uint64_t my_len = mine.size();
    std::vector<std::uint64_t> lens(count_);
    if (callback_(ctx_, &my_len, sizeof(my_len), lens.data()) != 0) {
      return absl::UnavailableError("leaders' exchange: the framework's all-gather failed");
    }
    std::uint64_t longest = 0;
    for (int i = 0; i < count_; ++i) {
      if (lens[i] > kMaxFrameBytes) {
        return absl::DataLossError(absl::StrFormat(
            "leaders' exchange: leader %d announces %d bytes (limit %d)", i, lens[i],
            kMaxFrameBytes));
      }
      longest = std::max(longest, lens[i]);
    }
    if (longest * static_cast<std::uint64_t>(count_) > kMaxRoundBytes) {
      return absl::DataLossError(absl::StrFormat(
          "leaders' exchange: a round of %d leaders of up to %d bytes exceeds %d bytes in all",
          count_, longest, kMaxRoundBytes));
    }
    if (lens[index_] != my_len) {
      return absl::DataLossError("leaders' exchange: the all-gather lost this leader's length");
    }
    std::string padded = mine;
    padded.resize(longest, '\0');
    std::string all(longest * count_, '\0');
    if (longest > 0 && callback_(ctx_, padded.data(), longest, all.data()) != 0) {
      return absl::UnavailableError("leaders' exchange: the framework's all-gather failed");
    }
    std::vector<std::string> out;
    for (int i = 0; i < count_; ++i) out.push_back(all.substr(i * longest, lens[i]));
    return out;
  }

 private:
  const AllGatherCallback callback_;
  void* const ctx_;
  const int index_;
  const int count_;
};

}  // namespace

TcpListener& TcpListener::operator=(TcpListener&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.fd_;
    port_ = o.port_;
    o.fd_ = -1;
  }
  return *this;
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<TcpListener> ListenTcp(const std::string& host, int port) {
  sockaddr_storage addr;
  socklen_t len = 0;
  if (absl::Status s = ParseAddress(host, port, &addr, &len); !s.ok()) return s;
  const int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return wire::Errno("socket");
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    absl::Status s = wire::Errno(absl::StrFormat("leaders' exchange: bind/listen on %s:%d", host, port));
    close(fd);
    return s;
  }
  const int bound = ntohs(addr.ss_family == AF_INET
                              ? reinterpret_cast<sockaddr_in*>(&addr)->sin_port
                              : reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return TcpListener(fd, bound);
}

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
  int rejected = 0, in = 1;
  auto drop = [&](std::size_t k) {
    ++rejected;
    close(pending[k].fd);
    pending.erase(pending.begin() + k);
  };
  while (in < count) {
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    for (std::size_t k = pending.size(); k-- > 0;) {
      if (now >= pending[k].by) drop(k);
    }
    std::vector<pollfd> fds;
    const bool accepting = pending.size() < kMaxPending;
    if (accepting) fds.push_back({l, POLLIN, 0});
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
    for (std::size_t f = fds.size(); f-- > (accepting ? 1u : 0u);) {
      const std::size_t k = f - (accepting ? 1 : 0);
      if (fds[f].revents == 0) continue;
      Pending& p = pending[k];
      char buf[kTcpHello];
      const ssize_t n = recv(p.fd, buf, kTcpHello - p.got.size(), 0);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) {
        drop(k);
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
        drop(k);
        continue;
      }
      std::string ack;
      Put(ack, kTcpHelloMagic);
      Put(ack, kTcpVersion);
      ack += TcpMac(token, "cma-tcpa", index, count, nonces);
      if (!wire::WriteAll(p.fd, ack.data(), ack.size(), p.by, "a connector").ok()) {
        drop(k);
        continue;
      }
      peers[index] = p.fd;
      pending.erase(pending.begin() + k);
      ++in;
    }
    if (accepting && (fds[0].revents & POLLIN) != 0 && in < count) {
      const int c = accept4(l, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) continue;  // EAGAIN, ECONNABORTED: wait again
      NoDelay(c);
      absl::StatusOr<std::string> nonce = wire::RandomBytes(wire::kNonceBytes);
      std::string challenge;
      Put(challenge, kTcpHelloMagic);
      Put(challenge, kTcpVersion);
      const absl::Time by = std::min(deadline, absl::Now() + kConnectorTime);
      if (!nonce.ok() ||
          !wire::WriteAll(c, (challenge + *nonce).data(), kTcpChallenge, by, "a connector").ok()) {
        ++rejected;
        close(c);
        continue;
      }
      pending.push_back({c, by, *nonce, std::string()});
    }
  }
  for (Pending& p : pending) close(p.fd);
  close(l);
  if (in < count) {
    std::vector<int> missing;
    for (int k = 1; k < count; ++k) {
      if (peers[k] < 0) missing.push_back(k);
    }
    wire::CloseAll(peers);
    return absl::DeadlineExceededError(absl::StrFormat(
        "leaders' exchange: timed out waiting for leaders to connect (never came: leader%s %s; "
        "%d connection(s) turned away)",
        missing.size() > 1 ? "s" : "", absl::StrJoin(missing, ", "), rejected));
  }
  return std::unique_ptr<ByteExchange>(new TcpByteExchange(0, count, timeout, std::move(peers)));
}

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
  for (;;) {
    const int c = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0) return wire::Errno("socket");
    int err = 0;
    if (connect(c, reinterpret_cast<sockaddr*>(&addr), len) != 0) err = errno;
    if (err == EINPROGRESS) {
      absl::Status s = wire::WaitFor(c, POLLOUT, deadline, who);
      socklen_t el = sizeof(err);
      if (!s.ok()) {
        close(c);
        return s;
      }
      if (getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    }
    if (err == 0) {
      NoDelay(c);
      char challenge[kTcpChallenge], ack[kTcpAck];
      absl::Status s = wire::ReadAll(c, challenge, sizeof(challenge), deadline, who);
      if (s.ok() && (At<std::uint32_t>(challenge) != kTcpHelloMagic ||
                     At<std::uint32_t>(challenge + 4) != kTcpVersion)) {
        s = absl::DataLossError(absl::StrCat("leaders' exchange: ", who,
                                             " is not a cma leaders' exchange of this version"));
      }
      // Nr, the root's; then Nc, this connector's own, fresh for this hello.
      std::string nonces(challenge + 8, wire::kNonceBytes);
      if (s.ok()) {
        absl::StatusOr<std::string> mine = wire::RandomBytes(wire::kNonceBytes);
        if (mine.ok()) {
          nonces += *mine;
        } else {
          s = mine.status();
        }
      }
      if (s.ok()) {
        std::string hello;
        Put(hello, kTcpHelloMagic);
        Put(hello, kTcpVersion);
        Put(hello, static_cast<std::int32_t>(index));
        Put(hello, static_cast<std::int32_t>(count));
        hello += nonces.substr(wire::kNonceBytes);
        hello += TcpMac(token, "cma-tcph", index, count, nonces);
        s = wire::WriteAll(c, hello.data(), hello.size(), deadline, who);
        if (s.ok()) s = wire::ReadAll(c, ack, sizeof(ack), deadline, who);
        if (absl::IsUnavailable(s)) {
          // What the root disliked it does not say (a wrong token, an index
          // taken, another count, or a hello too late): its error says.
          s = absl::UnavailableError(absl::StrFormat(
              "leaders' exchange: %s closed the connection before acknowledging this leader's "
              "hello (leader %d of %d); leader 0's error says why",
              who, index, count));
        } else if (s.ok() && (At<std::uint32_t>(ack) != kTcpHelloMagic ||
                              At<std::uint32_t>(ack + 4) != kTcpVersion ||
                              !TcpMacOk(ack + 8, TcpMac(token, "cma-tcpa", index, count, nonces)))) {
          s = absl::PermissionDeniedError(absl::StrCat(
              "leaders' exchange: ", who, " did not prove that it knows the rendezvous token"));
        }
      }
      if (!s.ok()) {
        close(c);
        return s;
      }
      std::vector<int> peers(count, -1);
      peers[0] = c;
      return std::unique_ptr<ByteExchange>(
          new TcpByteExchange(index, count, timeout, std::move(peers)));
    }
    close(c);
    if (err != ECONNREFUSED && err != EINTR && err != EAGAIN && err != ETIMEDOUT) {
      errno = err;
      return wire::Errno(absl::StrCat("leaders' exchange: connect to ", who));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("leaders' exchange: ", who, " never listened"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<std::unique_ptr<ByteExchange>> MakeCallbackByteExchange(AllGatherCallback callback,
                                                                       void* ctx, int index,
                                                                       int count) {
  if (callback == nullptr) return absl::InvalidArgumentError("leaders' exchange: null callback");
  if (absl::Status s = CheckParty(index, count); !s.ok()) return s;
  return std::unique_ptr<ByteExchange>(new CallbackByteExchange(callback, ctx, index, count));
}

}  // namespace cma
