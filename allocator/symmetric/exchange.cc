#include "allocator/symmetric/exchange.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cma {
namespace {

constexpr std::uint32_t kMagic = 0x434d4158;  // "CMAX"
constexpr int kMaxFds = 250;                  // under SCM_MAX_FD

struct Header {
  std::uint32_t magic;
  std::uint32_t ok;  // 0: an error frame whose bytes are the reason
  std::uint32_t bytes;
  std::uint32_t fds;
};

void CloseAll(std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  fds.clear();
}

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Waits until `fd` is ready for `events` or the deadline passes.
absl::Status WaitFor(int fd, short events, absl::Time deadline, const std::string& who) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("symmetric exchange: timed out waiting for ", who));
    }
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("poll");
    if (r == 0) continue;  // re-check the deadline
    if (p.revents & (POLLERR | POLLNVAL)) {
      return absl::UnavailableError(absl::StrCat("symmetric exchange: ", who, " disconnected"));
    }
    return absl::OkStatus();
  }
}

absl::Status WriteAll(int fd, const void* data, std::size_t n, absl::Time deadline,
                      const std::string& who) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    if (absl::Status s = WaitFor(fd, POLLOUT, deadline, who); !s.ok()) return s;
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (w <= 0) return absl::UnavailableError(absl::StrCat("symmetric exchange: ", who, " disconnected"));
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, std::size_t n, absl::Time deadline, const std::string& who) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    if (absl::Status s = WaitFor(fd, POLLIN, deadline, who); !s.ok()) return s;
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return absl::UnavailableError(absl::StrCat("symmetric exchange: ", who, " disconnected"));
    p += r;
    n -= static_cast<std::size_t>(r);
  }
  return absl::OkStatus();
}

// One frame: header (carrying the FDs) then the bytes.
absl::Status SendFrame(int sock, bool ok, const Contribution& c, absl::Time deadline,
                       const std::string& who) {
  if (c.fds.size() > kMaxFds) return absl::InvalidArgumentError("too many FDs in one exchange");
  Header h{kMagic, ok ? 1u : 0u, static_cast<std::uint32_t>(c.bytes.size()),
           static_cast<std::uint32_t>(c.fds.size())};
  iovec iov{&h, sizeof(h)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<std::size_t>(c.fds.size(), 1)));
  if (!c.fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * c.fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * c.fds.size());
    std::memcpy(CMSG_DATA(cm), c.fds.data(), sizeof(int) * c.fds.size());
  }
  if (absl::Status s = WaitFor(sock, POLLOUT, deadline, who); !s.ok()) return s;
  ssize_t w;
  do {
    w = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  if (w != static_cast<ssize_t>(sizeof(h))) {
    return absl::UnavailableError(absl::StrCat("symmetric exchange: ", who, " disconnected"));
  }
  return WriteAll(sock, c.bytes.data(), c.bytes.size(), deadline, who);
}

absl::StatusOr<Contribution> RecvFrame(int sock, absl::Time deadline, const std::string& who) {
  Header h{};
  iovec iov{&h, sizeof(h)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds));
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  if (absl::Status s = WaitFor(sock, POLLIN, deadline, who); !s.ok()) return s;
  ssize_t r;
  do {
    r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (r < 0 && errno == EINTR);
  Contribution c;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      const std::size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int* fds = reinterpret_cast<const int*>(CMSG_DATA(cm));
      c.fds.insert(c.fds.end(), fds, fds + n);
    }
  }
  if (r == 0) {
    CloseAll(c.fds);
    return absl::UnavailableError(absl::StrCat("symmetric exchange: ", who, " disconnected"));
  }
  if (r != static_cast<ssize_t>(sizeof(h)) || h.magic != kMagic || c.fds.size() != h.fds) {
    CloseAll(c.fds);
    return absl::DataLossError(absl::StrCat("symmetric exchange: malformed frame from ", who));
  }
  c.bytes.resize(h.bytes);
  if (absl::Status s = ReadAll(sock, c.bytes.data(), h.bytes, deadline, who); !s.ok()) {
    CloseAll(c.fds);
    return s;
  }
  if (!h.ok) {
    CloseAll(c.fds);
    return absl::AbortedError(absl::StrCat("symmetric exchange failed elsewhere: ", c.bytes));
  }
  return c;
}

std::vector<int> DupAll(const std::vector<int>& fds) {
  std::vector<int> out;
  for (int fd : fds) out.push_back(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  return out;
}

class SingleProcessExchange final : public Exchange {
 public:
  int process_count() const override { return 1; }
  int process_index() const override { return 0; }
  absl::StatusOr<std::vector<Contribution>> AllGather(const Contribution& mine) override {
    return std::vector<Contribution>{{mine.bytes, DupAll(mine.fds)}};
  }
};

class UnixSocketExchange final : public Exchange {
 public:
  UnixSocketExchange(int index, int count, absl::Duration timeout, std::vector<int> peers)
      : index_(index), count_(count), timeout_(timeout), peers_(std::move(peers)) {}
  ~UnixSocketExchange() override { CloseAll(peers_); }

  int process_count() const override { return count_; }
  int process_index() const override { return index_; }

  absl::StatusOr<std::vector<Contribution>> AllGather(const Contribution& mine) override {
    if (broken_) return absl::FailedPreconditionError("symmetric exchange: an earlier exchange failed");
    const absl::Time deadline = absl::Now() + timeout_;
    absl::StatusOr<std::vector<Contribution>> out =
        index_ == 0 ? Root(mine, deadline) : Leaf(mine, deadline);
    if (!out.ok()) broken_ = true;
    return out;
  }

 private:
  absl::StatusOr<std::vector<Contribution>> Root(const Contribution& mine, absl::Time deadline) {
    std::vector<Contribution> all(count_);
    all[0] = {mine.bytes, DupAll(mine.fds)};
    absl::Status failure;
    for (int i = 1; i < count_ && failure.ok(); ++i) {
      absl::StatusOr<Contribution> c =
          RecvFrame(peers_[i], deadline, absl::StrCat("process ", i));
      if (c.ok()) {
        all[i] = std::move(*c);
      } else {
        failure = c.status();
      }
    }
    for (int i = 1; i < count_; ++i) {
      const std::string who = absl::StrCat("process ", i);
      if (!failure.ok()) {
        (void)SendFrame(peers_[i], false, {std::string(failure.message()), {}}, deadline, who);
        continue;
      }
      for (int j = 0; j < count_ && failure.ok(); ++j) {
        failure = SendFrame(peers_[i], true, all[j], deadline, who);
      }
    }
    if (!failure.ok()) {
      for (Contribution& c : all) CloseAll(c.fds);
      return failure;
    }
    return all;
  }

  absl::StatusOr<std::vector<Contribution>> Leaf(const Contribution& mine, absl::Time deadline) {
    if (absl::Status s = SendFrame(peers_[0], true, mine, deadline, "process 0"); !s.ok()) return s;
    std::vector<Contribution> all;
    for (int j = 0; j < count_; ++j) {
      absl::StatusOr<Contribution> c = RecvFrame(peers_[0], deadline, "process 0");
      if (!c.ok()) {
        for (Contribution& x : all) CloseAll(x.fds);
        return c.status();
      }
      all.push_back(std::move(*c));
    }
    return all;
  }

  const int index_;
  const int count_;
  const absl::Duration timeout_;
  std::vector<int> peers_;  // root: one per process (peers_[0] unused); leaf: peers_[0] is root
  bool broken_ = false;
};

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(a.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad Unix socket path '", path, "'"));
  }
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return a;
}

}  // namespace

std::unique_ptr<Exchange> MakeSingleProcessExchange() {
  return std::make_unique<SingleProcessExchange>();
}

absl::StatusOr<std::unique_ptr<Exchange>> MakeUnixSocketExchange(const std::string& path,
                                                                  int process_index,
                                                                  int process_count,
                                                                  absl::Duration timeout) {
  if (process_count < 1 || process_index < 0 || process_index >= process_count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric exchange: process %d of %d is not a valid member", process_index, process_count));
  }
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> peers(process_count, -1);
  if (process_index == 0) {
    const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0) return Errno("socket");
    unlink(path.c_str());
    if (bind(listener, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
        listen(listener, process_count) != 0) {
      absl::Status s = Errno(absl::StrCat("bind/listen on ", path));
      close(listener);
      return s;
    }
    absl::Status failure;
    for (int accepted = 1; accepted < process_count && failure.ok(); ++accepted) {
      failure = WaitFor(listener, POLLIN, deadline,
                        absl::StrCat(process_count - accepted, " more process(es) to connect"));
      if (!failure.ok()) break;
      const int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) {
        failure = Errno("accept");
        break;
      }
      std::int32_t who = -1;
      failure = ReadAll(c, &who, sizeof(who), deadline, "a connecting process");
      if (failure.ok() && (who <= 0 || who >= process_count || peers[who] != -1)) {
        failure = absl::InvalidArgumentError(absl::StrCat("symmetric exchange: bad process index ", who));
      }
      if (!failure.ok()) {
        close(c);
        break;
      }
      peers[who] = c;
    }
    close(listener);
    unlink(path.c_str());
    if (!failure.ok()) {
      CloseAll(peers);
      return failure;
    }
  } else {
    // Process 0 may not be listening yet: retry until the deadline.
    int c = -1;
    for (;;) {
      c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (c < 0) return Errno("socket");
      if (connect(c, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) == 0) break;
      close(c);
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("symmetric exchange: process 0 never listened at ", path));
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    const std::int32_t me = process_index;
    if (absl::Status s = WriteAll(c, &me, sizeof(me), deadline, "process 0"); !s.ok()) {
      close(c);
      return s;
    }
    peers[0] = c;
  }
  return std::unique_ptr<Exchange>(
      new UnixSocketExchange(process_index, process_count, timeout, std::move(peers)));
}

absl::StatusOr<std::unique_ptr<Exchange>> MakeCallbackExchange(AllGatherCallback callback,
                                                               void* ctx, int process_index,
                                                               int process_count,
                                                               absl::Duration timeout) {
  if (callback == nullptr) return absl::InvalidArgumentError("symmetric exchange: null callback");
  constexpr std::size_t kLen = sizeof(sockaddr_un::sun_path);
  std::string mine(kLen, '\0');
  if (process_index == 0) {
    std::random_device rd;
    const std::string path =
        absl::StrFormat("/tmp/cma-symmetric-%d-%08x.sock", getpid(), rd());
    std::memcpy(mine.data(), path.data(), path.size());
  }
  std::string all(kLen * static_cast<std::size_t>(process_count), '\0');
  if (callback(ctx, mine.data(), kLen, all.data()) != 0) {
    return absl::UnavailableError("symmetric exchange: the framework's all-gather failed");
  }
  const std::string path(all.data());  // process 0's entry, NUL-terminated
  return MakeUnixSocketExchange(path, process_index, process_count, timeout);
}

}  // namespace cma
