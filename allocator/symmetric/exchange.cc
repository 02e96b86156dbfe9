#include "allocator/symmetric/exchange.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
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

absl::StatusOr<std::string> MakeRendezvousToken() {
  unsigned char raw[32];
  std::size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno("getrandom");
    got += static_cast<std::size_t>(n);
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
}

namespace {

// Process 0: accepts until every member has presented the token with a free
// index; anything else is closed unanswered and the wait goes on.
absl::Status AcceptMembers(int listener, int process_count, const std::string& token,
                           absl::Time deadline, std::vector<int>& peers) {
  const uid_t me = geteuid();
  int rejected = 0;
  std::string last_rejection;
  for (int accepted = 1; accepted < process_count;) {
    absl::Status s = WaitFor(listener, POLLIN, deadline,
                             absl::StrCat(process_count - accepted, " more process(es) to connect"));
    if (!s.ok()) {
      if (rejected > 0) {
        s = absl::Status(s.code(), absl::StrFormat("%s; rejected %d connection(s), the last: %s",
                                                   s.message(), rejected, last_rejection));
      }
      return s;
    }
    const int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return Errno("accept");
    }
    // A silent connector must not hold the rendezvous up for long.
    const absl::Time hello_deadline = std::min(deadline, absl::Now() + absl::Seconds(2));
    absl::StatusOr<uid_t> uid = wire::PeerUid(c);
    absl::StatusOr<int> who = absl::PermissionDeniedError("");
    if (!uid.ok()) {
      who = uid.status();
    } else if (*uid != me) {
      who = absl::PermissionDeniedError(absl::StrFormat("uid %d is not this user (%d)", *uid, me));
    } else {
      who = wire::ReadHello(c, token, process_count, hello_deadline);
    }
    if (who.ok() && peers[*who] != -1) {
      who = absl::PermissionDeniedError(absl::StrFormat("process index %d is taken", *who));
    }
    if (who.ok()) {
      if (absl::Status w = wire::SendWelcome(c, deadline); !w.ok()) {
        close(c);
        return w;
      }
      peers[*who] = c;
      ++accepted;
      continue;
    }
    ++rejected;
    last_rejection = std::string(who.status().message());
    close(c);
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
    unlink(path.c_str());  // a stale socket of an earlier run
  }
  const int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<int> peers(process_count, -1);
  if (process_index == 0) {
    int listener = -1;
    if (absl::Status s = Listen(path, *addr, process_count, &listener); !s.ok()) return s;
    absl::Status failure = AcceptMembers(listener, process_count, token, deadline, peers);
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
    // Our handles go only to process 0 of our own user.
    absl::StatusOr<uid_t> uid = wire::PeerUid(c);
    absl::Status s = uid.status();
    if (s.ok() && *uid != geteuid()) {
      s = absl::PermissionDeniedError(absl::StrFormat(
          "symmetric exchange: the process listening at %s runs as uid %d, not this user", path,
          *uid));
    }
    if (s.ok()) s = wire::SendHello(c, process_index, token, deadline);
    if (s.ok()) s = wire::ReadWelcome(c, deadline);
    if (!s.ok()) {
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
    x = MakeUnixSocketExchange(path, process_index, process_count, timeout, token);
  }
  if (!dir.empty()) rmdir(dir.c_str());  // the socket itself is gone already
  return x;
}

}  // namespace cma
