// ByteExchange implementations (multi_host.h): over TCP (party 0 relays every
// round, like a store; its hello is tcp_hello.cc's) and over a framework's
// fixed-size all-gather. Bytes
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
#include "allocator/symmetric/tcp_internal.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace {

using namespace tcp_internal;  // NOLINT: this file's own helpers

constexpr std::uint32_t kTcpFrameMagic = 0x434d4142;  // "CMAB"
// Frames are read as their bytes come, this much at a time: an announced
// length is not memory until the bytes are there.
constexpr std::size_t kReadChunk = std::size_t{64} << 10;
// A round moves count * kMaxFrameBytes at most: count is bounded, and so is
// what one round may bring in all (a hostile peer cannot make us hold more).
constexpr std::size_t kMaxRoundBytes = std::size_t{64} << 20;

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
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, kTcpBacklog) != 0 ||
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

namespace tcp_internal {

std::unique_ptr<ByteExchange> NewTcpByteExchange(int index, int count, absl::Duration timeout,
                                                 std::vector<int> peers) {
  return std::unique_ptr<ByteExchange>(new TcpByteExchange(index, count, timeout, std::move(peers)));
}

}  // namespace tcp_internal

absl::StatusOr<std::unique_ptr<ByteExchange>> MakeCallbackByteExchange(AllGatherCallback callback,
                                                                       void* ctx, int index,
                                                                       int count) {
  if (callback == nullptr) return absl::InvalidArgumentError("leaders' exchange: null callback");
  if (absl::Status s = CheckParty(index, count); !s.ok()) return s;
  return std::unique_ptr<ByteExchange>(new CallbackByteExchange(callback, ctx, index, count));
}

}  // namespace cma
