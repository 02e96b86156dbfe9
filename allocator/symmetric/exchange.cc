#include "allocator/symmetric/exchange.h"

#include <sys/stat.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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
      for (int& fd : peers_) {
        if (fd >= 0) {
          shutdown(fd, SHUT_RDWR);
          close(fd);
          fd = -1;
        }
      }
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
              "symmetric exchange: timed out waiting for process 0 to welcome every member (it "
              "was still waiting for some to connect)");
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

absl::StatusOr<std::string> MakeRendezvousToken() {
  absl::StatusOr<std::string> raw = wire::RandomBytes(32);
  if (!raw.ok()) return raw.status();
  return absl::BytesToHexString(*raw);
}

namespace {

// Process 0's view of a connector that has not yet proved itself.
struct Pending {
  int fd = -1;
  pid_t pid = 0;
  absl::Time deadline;  // its own: a silent connector only ever costs itself
  std::string got;      // the part of its hello, then of its proof, read so far
  bool challenged = false;
  wire::Hello hello;
  std::string nonce;  // the challenge we sent it
};

// A connector gets this long to complete the handshake; at most kMaxPending
// wait at once (past that the oldest is dropped), so that a flood of
// connections can neither hold up the real members nor exhaust our FDs.
constexpr absl::Duration kHelloTime = absl::Seconds(2);
constexpr std::size_t kMaxPending = 64;

// Process 0: accepts until every member has proved it knows the token and
// claimed a free index. Every pending connector is read at once, each
// against its own deadline; anything else is closed and the wait goes on.
// A connector is sent nothing until its hello is well formed and comes from
// the process it names; then only our challenge and proof.
absl::Status AcceptMembers(int listener, int process_count, const std::string& token,
                           absl::Time deadline, std::vector<int>& peers) {
  const uid_t me = geteuid();
  int rejected = 0;
  std::string last_rejection;
  std::vector<Pending> pending;
  std::vector<pid_t> pids(process_count, 0);  // of the members let in
  std::string left;  // members that were let in and left
  // `tell`: the connector sent a well-formed hello of its own, so it is a
  // member (or one misconfigured): it gets the reason, and so can tell a
  // rejection from a process 0 that died. A best-effort send: the verdict
  // is small and the socket's buffer fresh.
  auto reject = [&](std::size_t i, std::string why, bool tell) {
    ++rejected;
    if (tell) {
      const std::string v = wire::Verdict(absl::PermissionDeniedError(why));
      (void)send(pending[i].fd, v.data(), v.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    last_rejection = std::move(why);
    close(pending[i].fd);
    pending.erase(pending.begin() + i);
  };
  auto drop_all = [&] {
    for (Pending& p : pending) close(p.fd);
    pending.clear();
  };
  // Reads what connector i sent and moves it on (it may leave `pending`);
  // an error only for a failure of our own (no randomness).
  auto step = [&](std::size_t i, int& accepted) -> absl::Status {
    Pending& p = pending[i];
    const std::size_t want = p.challenged ? wire::kProofBytes : wire::kHelloBytes;
    char buf[wire::kHelloBytes > wire::kProofBytes ? wire::kHelloBytes : wire::kProofBytes];
    const ssize_t n = recv(p.fd, buf, want - p.got.size(), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return absl::OkStatus();
    if (n <= 0) {
      reject(i,
             p.challenged
                 ? absl::StrFormat("process %d closed before proving it knows the token "
                                   "(a wrong token?)",
                                   p.pid)
                 : absl::StrFormat("process %d closed before its hello was complete", p.pid),
             /*tell=*/false);
      return absl::OkStatus();
    }
    p.got.append(buf, static_cast<std::size_t>(n));
    if (p.got.size() < want) return absl::OkStatus();
    if (!p.challenged) {
      // Parsed against any count first: a well-formed hello whose index is
      // out of range or taken is a member's, and is told so.
      absl::StatusOr<wire::Hello> h =
          wire::ParseHello(p.got, std::numeric_limits<std::int32_t>::max(), p.pid);
      if (!h.ok()) {
        reject(i, std::string(h.status().message()), /*tell=*/false);
        return absl::OkStatus();
      }
      if (h->index >= process_count || peers[h->index] != -1) {
        reject(i,
               h->index >= process_count
                   ? absl::StrFormat("process index %d is out of range (%d processes)", h->index,
                                     process_count)
                   : absl::StrFormat("process index %d is taken", h->index),
               /*tell=*/true);
        return absl::OkStatus();
      }
      absl::StatusOr<std::string> nonce = wire::RandomBytes(wire::kNonceBytes);
      if (!nonce.ok()) return nonce.status();
      p.hello = std::move(*h);
      p.nonce = std::move(*nonce);
      p.got.clear();
      p.challenged = true;
      // A fresh socket's buffer takes the whole challenge: a short send
      // means the connector is already gone.
      const std::string challenge = wire::Challenge(token, p.hello, p.nonce);
      if (send(p.fd, challenge.data(), challenge.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(challenge.size())) {
        reject(i, absl::StrFormat("process %d left before its challenge", p.pid), /*tell=*/false);
      }
      return absl::OkStatus();
    }
    absl::Status proof = wire::CheckProof(p.got, token, p.hello, p.nonce);
    if (proof.ok() && peers[p.hello.index] != -1) {
      proof = absl::PermissionDeniedError(
          absl::StrFormat("process index %d is taken", p.hello.index));
    }
    if (!proof.ok()) {
      reject(i, std::string(proof.message()), /*tell=*/true);
      return absl::OkStatus();
    }
    peers[p.hello.index] = p.fd;
    pids[p.hello.index] = p.pid;
    ++accepted;
    pending.erase(pending.begin() + i);
    return absl::OkStatus();
  };
  for (int accepted = 1; accepted < process_count;) {
    absl::Time now = absl::Now();
    for (std::size_t i = pending.size(); i-- > 0;) {
      if (pending[i].deadline <= now) {
        reject(i,
               absl::StrFormat("process %d did not complete the handshake within %s",
                               pending[i].pid, absl::FormatDuration(kHelloTime)),
               /*tell=*/pending[i].challenged);
      }
    }
    if (now >= deadline) {
      drop_all();
      std::vector<int> missing;
      for (int k = 1; k < process_count; ++k) {
        if (peers[k] == -1) missing.push_back(k);
      }
      std::string msg = absl::StrFormat("timed out waiting for process%s %s (of %d) to connect",
                                        missing.size() > 1 ? "es" : "",
                                        absl::StrJoin(missing, ", "), process_count);
      msg += left;
      if (rejected > 0) {
        absl::StrAppendFormat(&msg, "; rejected %d connection(s), the last: %s", rejected,
                              last_rejection);
      }
      return absl::DeadlineExceededError(msg);
    }
    absl::Time wake = deadline;
    std::vector<pollfd> fds{{listener, POLLIN, 0}};
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      wake = std::min(wake, p.deadline);
    }
    // Members already in are watched for a hangup only (their first round
    // may already be waiting in the socket): one that dies frees its index
    // (it may come back) and is named if the rendezvous times out.
    std::vector<int> in;
    for (int k = 1; k < process_count; ++k) {
      if (peers[k] != -1) {
        fds.push_back({peers[k], 0, 0});
        in.push_back(k);
      }
    }
    const std::int64_t ms =
        std::min<std::int64_t>(absl::ToInt64Milliseconds(wake - now), 60'000) + 1;
    const int r = poll(fds.data(), fds.size(), static_cast<int>(ms));
    if (r < 0 && errno != EINTR) {
      drop_all();
      return Errno("poll");
    }
    if (r <= 0) continue;
    for (std::size_t j = 0; j < in.size(); ++j) {
      if (fds[pending.size() + 1 + j].revents & (POLLHUP | POLLERR)) {
        const int k = in[j];
        absl::StrAppendFormat(&left, "; process %d (pid %d) had connected and left", k,
                              pids[k]);
        close(peers[k]);
        peers[k] = -1;
        --accepted;
      }
    }
    // Back to front, so that erasing keeps the earlier indices valid.
    for (std::size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      if (absl::Status s = step(i, accepted); !s.ok()) {
        drop_all();
        return s;
      }
    }
    if (fds[0].revents == 0) continue;
    const int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      drop_all();
      return Errno("accept");
    }
    absl::StatusOr<ucred> cred = wire::PeerCred(c);
    if (!cred.ok() || cred->uid != me) {
      ++rejected;
      last_rejection = cred.ok() ? absl::StrFormat("uid %d is not this user (%d)", cred->uid, me)
                                 : std::string(cred.status().message());
      close(c);
      continue;
    }
    if (pending.size() >= kMaxPending) {
      reject(0,
             absl::StrFormat("more than %d connections waited at once; dropped the oldest",
                             kMaxPending),
             /*tell=*/pending[0].challenged);
    }
    Pending p;
    p.fd = c;
    p.pid = cred->pid;
    p.deadline = std::min(deadline, absl::Now() + kHelloTime);
    pending.push_back(std::move(p));
  }
  drop_all();
  return absl::OkStatus();
}

// When the rendezvous fails, process 0's verdict to every member let in
// (who never connected, say), so that each member's first AllGather reports
// the real cause rather than a timeout waiting for process 0. (On success,
// process 0's first round is the welcome.) Returns process 0's own status.
absl::Status TellMembers(const absl::Status& failure, const std::vector<int>& peers) {
  if (failure.ok()) return failure;
  const std::string v = wire::Verdict(failure);
  for (std::size_t k = 1; k < peers.size(); ++k) {
    if (peers[k] != -1) (void)send(peers[k], v.data(), v.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  return absl::Status(failure.code(), absl::StrCat("symmetric exchange: ", failure.message()));
}

// Refuses a socket whose directory others could write to (an attacker there
// could swap the socket between our check and our connect): the directory
// must be ours or root's, and writable by no one else unless sticky (/tmp).
// `strict` (the callback bootstrap's own directory): ours and 0700 exactly.
absl::Status CheckDirectory(const std::string& path, bool strict) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return Errno(absl::StrCat("symmetric exchange: ", dir));
  const uid_t me = geteuid();
  if (!S_ISDIR(st.st_mode)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "symmetric exchange: ", dir, " (the socket's directory) is not a directory (a symlink?)"));
  }
  if (strict && (st.st_uid != me || (st.st_mode & 0777) != 0700)) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "symmetric exchange: the rendezvous directory %s must be this user's (%d) with mode 0700; "
        "it is owned by %d with mode %04o",
        dir, me, st.st_uid, st.st_mode & 0777));
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

// A member's connection to process 0, retried until process 0 listens;
// non-blocking, so that a full backlog cannot hold us past the deadline.
absl::StatusOr<int> ConnectToRoot(const std::string& path, const sockaddr_un& addr,
                                  absl::Time deadline) {
  for (;;) {
    const int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0) return Errno("socket");
    int err = 0;
    if (connect(c, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return c;
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
    absl::SleepFor(std::min(left, absl::Milliseconds(5)));
  }
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

absl::Status Listen(const std::string& path, const sockaddr_un& addr, int process_count,
                    int* listener) {
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
  if (process_count < 1 || process_index < 0 || process_index >= process_count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric exchange: process %d of %d is not a valid member", process_index, process_count));
  }
  if (absl::Status s = wire::CheckToken(token); !s.ok()) return s;
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return s;
  if (absl::Status s = wire::CryptoReady(); !s.ok()) return s;
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  if (absl::Status s = CheckDirectory(path, /*strict=*/false); !s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> peers(process_count, -1);
  if (process_index == 0) {
    int listener = -1;
    if (absl::Status s = Listen(path, *addr, process_count, &listener); !s.ok()) return s;
    absl::Status failure = AcceptMembers(listener, process_count, token, deadline, peers);
    close(listener);
    unlink(path.c_str());
    failure = TellMembers(failure, peers);
    if (!failure.ok()) {
      CloseAll(peers);
      return failure;
    }
  } else {
    absl::StatusOr<int> c = ConnectToRoot(path, *addr, deadline);
    if (!c.ok()) return c.status();
    if (absl::Status s = wire::MemberHandshake(*c, process_index, token, deadline); !s.ok()) {
      close(*c);
      return s;
    }
    peers[0] = *c;
  }
  return std::unique_ptr<Exchange>(
      new UnixSocketExchange(process_index, process_count, timeout, std::move(peers)));
}

absl::StatusOr<std::unique_ptr<Exchange>> MakeCallbackExchange(AllGatherCallback callback,
                                                               void* ctx, int process_index,
                                                               int process_count,
                                                               absl::Duration timeout) {
  if (callback == nullptr) return absl::InvalidArgumentError("symmetric exchange: null callback");
  if (absl::Status s = CheckTimeout(timeout); !s.ok()) return s;
  // Process 0's entry: the socket path, then the token, each NUL-padded.
  constexpr std::size_t kPath = sizeof(sockaddr_un::sun_path);
  constexpr std::size_t kLen = kPath + kMaxTokenBytes;
  std::string mine(kLen, '\0');
  std::string dir;
  if (process_index == 0) {
    char tmpl[] = "/tmp/cma-symmetric-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Errno("mkdtemp");  // 0700: ours alone
    dir = tmpl;
    const std::string path = dir + "/rendezvous.sock";
    absl::StatusOr<std::string> token = MakeRendezvousToken();
    if (!token.ok()) {
      rmdir(dir.c_str());
      return token.status();
    }
    std::memcpy(mine.data(), path.data(), path.size());
    std::memcpy(mine.data() + kPath, token->data(), token->size());
  }
  std::string all(kLen * static_cast<std::size_t>(process_count), '\0');
  absl::StatusOr<std::unique_ptr<Exchange>> x =
      absl::UnavailableError("symmetric exchange: the framework's all-gather failed");
  if (callback(ctx, mine.data(), kLen, all.data()) == 0) {
    const std::string path(all.data(), strnlen(all.data(), kPath));
    const std::string token(all.data() + kPath, strnlen(all.data() + kPath, kMaxTokenBytes));
    // Process 0 made the directory private; everyone checks that it still is.
    absl::Status private_dir = CheckDirectory(path, /*strict=*/true);
    x = private_dir.ok()
            ? MakeUnixSocketExchange(path, process_index, process_count, timeout, token)
            : private_dir;
  }
  if (!dir.empty()) rmdir(dir.c_str());  // the socket itself is gone already
  return x;
}

}  // namespace cma
