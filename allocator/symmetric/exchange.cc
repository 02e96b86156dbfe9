#include "allocator/symmetric/exchange.h"

#include <sys/stat.h>
#include <sys/syscall.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/socket_rendezvous.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace {

using wire::CloseAll;
using wire::Errno;
using wire::ReadAll;
using wire::RecvFrame;
using wire::SendFrame;
using wire::WaitFor;
using wire::WriteAll;

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
    // Once a round failed, the members disagree on where they are: every
    // later round fails at once, naming the first failure.
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "symmetric exchange: an earlier exchange failed (", broken_.message(), ")"));
    }
    const absl::Time deadline = absl::Now() + timeout_;
    absl::StatusOr<std::vector<Contribution>> out =
        index_ == 0 ? Root(mine, deadline) : Leaf(mine, deadline);
    if (!out.ok()) {
      broken_ = out.status();
      // Tell the others now: they see a disconnect at once rather than wait
      // out their timeout for a round this process will never send.
      wire::ShutdownAll(peers_);
    }
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
    const absl::Status sent = SendFrame(peers_[0], true, mine, deadline, "process 0");
    // A send that failed here (not a peer gone) is ours to report.
    if (!sent.ok() && (welcomed_ || !absl::IsUnavailable(sent))) return sent;
    std::vector<Contribution> all;
    if (!welcomed_) {
      // Process 0's first frame is the welcome; in its place may come its
      // verdict on the rendezvous, which also says best why our send failed
      // (it went away, or it rejected our proof).
      const absl::Time by = sent.ok() ? deadline + wire::kVerdictGrace
                                      : std::min(deadline, absl::Now() + wire::kVerdictGrace);
      absl::StatusOr<Contribution> first = RecvFrame(peers_[0], by, "process 0");
      if (!first.ok()) {
        if (absl::IsUnavailable(first.status())) {
          absl::StatusOr<ucred> peer = wire::PeerCred(peers_[0]);
          return wire::ProcessZeroLeft(peer.ok() ? peer->pid : 0, "before welcoming this process");
        }
        if (absl::IsDeadlineExceeded(first.status()) && absl::Now() >= by) {
          return absl::DeadlineExceededError(
              "symmetric exchange: timed out waiting for process 0's first round, which is its "
              "welcome once every member is in (were some still connecting, or did process 0 "
              "never call AllGather?)");
        }
        return first.status();
      }
      welcomed_ = true;
      if (!sent.ok()) {
        CloseAll(first->fds);
        return sent;
      }
      all.push_back(std::move(*first));
    }
    for (int j = static_cast<int>(all.size()); j < count_; ++j) {
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
  absl::Status broken_;  // the first failed round's status
  bool welcomed_ = false;  // a member: process 0's first frame came (all are in)
};

}  // namespace

namespace rendezvous {

absl::StatusOr<SocketAddress> Address(const std::string& path) {
  SocketAddress s;
  s.addr.sun_family = AF_UNIX;
  if (path.size() < 2 || path.size() >= sizeof(s.addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("bad Unix socket path '", path, "'"));
  }
  std::memcpy(s.addr.sun_path, path.data(), path.size());
  if (path[0] == '@') {
    // The abstract namespace: the name's bytes, without a terminating NUL.
    s.addr.sun_path[0] = '\0';
    s.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  } else {
    s.len = sizeof(s.addr);  // NUL-terminated: the rest is zero
  }
  return s;
}

}  // namespace rendezvous

std::unique_ptr<Exchange> MakeSingleProcessExchange() {
  return std::make_unique<SingleProcessExchange>();
}

absl::StatusOr<std::string> MakeRendezvousToken() {
  for (;;) {  // a draw that fails the screens (below 1e-13) is drawn again
    absl::StatusOr<std::string> raw = wire::RandomBytes(32);
    if (!raw.ok()) return raw.status();
    std::string token = absl::BytesToHexString(*raw);
    if (wire::CheckToken(token).ok()) return token;
  }
}

namespace {

// Refuses a socket whose directory others could write to (an attacker there
// could swap the socket between our check and our connect): the directory
// must be ours or root's, and writable by no one else unless sticky (/tmp).
absl::Status CheckDirectory(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return Errno(absl::StrCat("symmetric exchange: ", dir));
  const uid_t me = geteuid();
  if (!S_ISDIR(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "symmetric exchange: ", dir, " (the socket's directory) is not a directory (a symlink?)"));
  }
  if (st.st_uid != me && st.st_uid != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "symmetric exchange: the socket's directory %s belongs to uid %d, neither this user nor "
        "root",
        dir, st.st_uid));
  }
  if ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "symmetric exchange: the socket's directory %s (mode %04o) is writable by others and not "
        "sticky: anyone could replace the socket",
        dir, st.st_mode & 07777));
  }
  return absl::OkStatus();
}

// Process 0 as the bootstrap published it, watched while a member waits to
// connect: one that died will never listen, and waiting out the timeout
// would only hide that. A pidfd tells an exited process (a zombie too) from
// a live one and never follows a reused pid; without one (kernels before
// 5.3), /proc says whether the pid is gone or a zombie.
class RootWatch {
 public:
  explicit RootWatch(pid_t pid) : pid_(pid) {
    if (pid_ > 0) fd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
    if (fd_ < 0 && errno == ESRCH) gone_ = true;
  }
  ~RootWatch() {
    if (fd_ >= 0) close(fd_);
  }
  RootWatch(const RootWatch&) = delete;
  RootWatch& operator=(const RootWatch&) = delete;

  // Sleeps up to `d` (less if process 0 exits meanwhile); kUnavailable
  // naming it once it has exited.
  absl::Status SleepFor(absl::Duration d) {
    if (pid_ > 0 && !gone_ && fd_ >= 0) {
      pollfd p{fd_, POLLIN, 0};
      gone_ = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(d)) + 1) > 0;
    } else {
      absl::SleepFor(d);
      if (pid_ > 0 && !gone_) gone_ = Exited();
    }
    if (!gone_) return absl::OkStatus();
    return absl::UnavailableError(absl::StrFormat(
        "symmetric exchange: process 0 (pid %d, as the bootstrap published it) has exited, so it "
        "will never listen: it died before this member connected (see its own error)",
        pid_));
  }

 private:
  bool Exited() const {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", pid_);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT;
    char buf[512];
    const ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = '\0';
    const char* state = std::strrchr(buf, ')');  // the command may hold spaces and parentheses
    return state != nullptr && state[1] == ' ' && (state[2] == 'Z' || state[2] == 'X');
  }

  const pid_t pid_;
  int fd_ = -1;
  bool gone_ = false;
};

// A member's connection to process 0, retried until process 0 listens;
// non-blocking, so that a full backlog cannot hold us past the deadline.
// `root_pid`, when not 0, is process 0's published pid: the retries stop
// as soon as it has exited.
absl::StatusOr<int> ConnectToRoot(const std::string& path, const rendezvous::SocketAddress& to,
                                  absl::Time deadline, pid_t root_pid) {
  RootWatch root(root_pid);
  for (;;) {
    const int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0) return Errno("socket");
    int err = 0;
    if (connect(c, reinterpret_cast<const sockaddr*>(&to.addr), to.len) == 0) return c;
    err = errno;
    if (err == EINPROGRESS) {
      absl::Status s = WaitFor(c, POLLOUT, deadline, absl::StrCat("process 0 at ", path));
      socklen_t len = sizeof(err);
      if (s.ok() && getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) return c;
      if (!s.ok()) {
        close(c);
        return s;
      }
    }
    close(c);
    // Not listening yet (ENOENT, ECONNREFUSED) or its backlog is full (EAGAIN).
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN && err != EINTR) {
      errno = err;
      return Errno(absl::StrCat("symmetric exchange: connect to ", path));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "symmetric exchange: process 0 never listened at ", path,
          err == EAGAIN ? " (or its backlog stayed full)" : ""));
    }
    if (absl::Status s = root.SleepFor(std::min(left, absl::Milliseconds(5))); !s.ok()) return s;
  }
}

}  // namespace

namespace rendezvous {

absl::Status CheckMember(int process_index, int process_count) {
  if (process_count < 1 || process_index < 0 || process_index >= process_count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric exchange: process %d of %d is not a valid member", process_index, process_count));
  }
  return absl::OkStatus();
}

absl::Status CheckTimeout(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration() || timeout > kMaxExchangeTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "symmetric exchange: the timeout must be positive and at most ",
        absl::FormatDuration(kMaxExchangeTimeout), " (got ", absl::FormatDuration(timeout),
        "): every wait is bounded, so that a dead member is reported, never waited for"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Exchange>> AsRoot(int listener, int process_count,
                                                 absl::Duration timeout, const std::string& token,
                                                 absl::Time deadline) {
  std::vector<int> peers(process_count, -1);
  absl::Status failure = AcceptMembers(listener, process_count, token, deadline, peers);
  close(listener);
  failure = TellMembers(failure, peers);
  if (!failure.ok()) {
    CloseAll(peers);
    return failure;
  }
  return std::unique_ptr<Exchange>(
      new UnixSocketExchange(0, process_count, timeout, std::move(peers)));
}

absl::StatusOr<std::unique_ptr<Exchange>> AsMember(const std::string& path,
                                                   const SocketAddress& root, int process_index,
                                                   int process_count, absl::Duration timeout,
                                                   const std::string& token, absl::Time deadline,
                                                   pid_t root_pid) {
  absl::StatusOr<int> c = ConnectToRoot(path, root, deadline, root_pid);
  if (!c.ok()) return c.status();
  if (root_pid != 0) {
    absl::StatusOr<ucred> peer = wire::PeerCred(*c);
    if (!peer.ok() || peer->pid != root_pid) {
      close(*c);
      return peer.ok() ? absl::PermissionDeniedError(absl::StrFormat(
                             "symmetric exchange: the process listening at %s is process %d, not "
                             "process 0 (%d) as the framework's all-gather says",
                             path, peer->pid, root_pid))
                       : peer.status();
    }
  }
  if (absl::Status s = wire::MemberHandshake(*c, process_index, token, deadline); !s.ok()) {
    close(*c);
    return s;
  }
  std::vector<int> peers(process_count, -1);
  peers[0] = *c;
  return std::unique_ptr<Exchange>(
      new UnixSocketExchange(process_index, process_count, timeout, std::move(peers)));
}

}  // namespace rendezvous

namespace {

absl::Status Listen(const std::string& path, const rendezvous::SocketAddress& at,
                    int process_count, int* listener) {
  const sockaddr_un& addr = at.addr;
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "symmetric exchange: ", path, " exists and is not a socket; it is left alone"));
    }
    // A stale socket of an earlier run is replaced; one that something still
    // listens on (another rendezvous at the same path) is not taken over.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (probe < 0) return Errno("socket");
    const bool live = connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 ||
                      errno == EAGAIN;
    close(probe);
    if (live) {
      return absl::AlreadyExistsError(absl::StrCat(
          "symmetric exchange: a live process listens at ", path,
          " (another rendezvous?); it is left alone"));
    }
    unlink(path.c_str());
  }
  // Non-blocking: a connector that leaves between poll and accept must not
  // block the accept.
  const int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (l < 0) return Errno("socket");
  // Owner-only from the start would need umask, which is process-wide;
  // between bind and chmod the token and peer credentials still guard it.
  if (bind(l, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(path.c_str(), 0600) != 0 || listen(l, process_count + 8) != 0) {
    absl::Status s = Errno(absl::StrCat("bind/listen on ", path));
    close(l);
    unlink(path.c_str());
    return s;
  }
  *listener = l;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Exchange>> MakeUnixSocketExchange(const std::string& path,
                                                                  int process_index,
                                                                  int process_count,
                                                                  absl::Duration timeout,
                                                                  const std::string& token) {
  if (absl::Status s = rendezvous::CheckMember(process_index, process_count); !s.ok()) return s;
  if (absl::Status s = wire::CheckToken(token); !s.ok()) return s;
  if (absl::Status s = rendezvous::CheckTimeout(timeout); !s.ok()) return s;
  if (absl::Status s = wire::CryptoReady(); !s.ok()) return s;
  if (!path.empty() && path[0] == '@') {
    return absl::InvalidArgumentError(absl::StrCat(
        "symmetric exchange: '", path, "' is an abstract socket name; a path is needed here"));
  }
  absl::StatusOr<rendezvous::SocketAddress> addr = rendezvous::Address(path);
  if (!addr.ok()) return addr.status();
  if (absl::Status s = CheckDirectory(path); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  if (process_index != 0) {
    return rendezvous::AsMember(path, *addr, process_index, process_count, timeout, token,
                                deadline, /*root_pid=*/0);
  }
  int listener = -1;
  if (absl::Status s = Listen(path, *addr, process_count, &listener); !s.ok()) return s;
  auto x = rendezvous::AsRoot(listener, process_count, timeout, token, deadline);
  unlink(path.c_str());
  return x;
}

}  // namespace cma
