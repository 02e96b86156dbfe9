// The rendezvous wire protocol: frames carrying bytes and FDs, and the
// authenticated hello a connecting member sends first.
#include "allocator/symmetric/wire.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cma {
namespace wire {
namespace {

constexpr std::uint32_t kMagic = 0x434d4158;       // "CMAX": a frame
constexpr std::uint32_t kHelloMagic = 0x434d4148;  // "CMAH": a member's hello
constexpr std::uint32_t kWelcomeMagic = 0x434d4157;  // "CMAW": process 0 accepted it
constexpr std::uint32_t kVersion = 2;

struct Header {
  std::uint32_t magic;
  std::uint32_t ok;  // 0: an error frame whose bytes are the reason
  std::uint32_t bytes;
  std::uint32_t fds;
};

struct HelloHeader {
  std::uint32_t magic;
  std::uint32_t version;
  std::int32_t index;
  std::uint32_t token_bytes;
};

}  // namespace




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
  // Bounded before anything is allocated: a peer cannot make us reserve 4 GiB.
  if (h.bytes > kMaxFrameBytes || h.fds > static_cast<std::uint32_t>(kMaxFds)) {
    CloseAll(c.fds);
    return absl::DataLossError(absl::StrFormat(
        "symmetric exchange: frame from %s announces %d bytes and %d FDs (limits %d and %d)", who,
        h.bytes, h.fds, kMaxFrameBytes, kMaxFds));
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

absl::StatusOr<uid_t> PeerUid(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno("SO_PEERCRED");
  return cred.uid;
}

bool TokensEqual(const std::string& a, const std::string& b) {
  // Constant time in the token's content: no early exit on a mismatch.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::Status CheckToken(const std::string& token) {
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric exchange: the rendezvous token must have %d to %d bytes (has %d); "
        "MakeRendezvousToken makes one",
        kMinTokenBytes, kMaxTokenBytes, token.size()));
  }
  return absl::OkStatus();
}

absl::Status SendHello(int sock, int index, const std::string& token, absl::Time deadline) {
  HelloHeader h{kHelloMagic, kVersion, index, static_cast<std::uint32_t>(token.size())};
  std::string msg(reinterpret_cast<const char*>(&h), sizeof(h));
  msg += token;
  return WriteAll(sock, msg.data(), msg.size(), deadline, "process 0");
}

absl::StatusOr<int> ReadHello(int sock, const std::string& token, int process_count,
                              absl::Time deadline) {
  HelloHeader h{};
  if (absl::Status s = ReadAll(sock, &h, sizeof(h), deadline, "a connecting process"); !s.ok()) {
    return s;
  }
  if (h.magic != kHelloMagic || h.version != kVersion) {
    return absl::PermissionDeniedError("not a cma member's hello (wrong magic or version)");
  }
  if (h.token_bytes < kMinTokenBytes || h.token_bytes > kMaxTokenBytes) {
    return absl::PermissionDeniedError(
        absl::StrFormat("hello announces a %d-byte token", h.token_bytes));
  }
  std::string presented(h.token_bytes, '\0');
  if (absl::Status s = ReadAll(sock, presented.data(), presented.size(), deadline,
                               "a connecting process");
      !s.ok()) {
    return s;
  }
  if (!TokensEqual(presented, token)) return absl::PermissionDeniedError("wrong token");
  if (h.index <= 0 || h.index >= process_count) {
    return absl::PermissionDeniedError(absl::StrFormat("bad process index %d", h.index));
  }
  return h.index;
}

absl::Status SendWelcome(int sock, absl::Time deadline) {
  const std::uint32_t w = kWelcomeMagic;
  return WriteAll(sock, &w, sizeof(w), deadline, "a member");
}

absl::Status ReadWelcome(int sock, absl::Time deadline) {
  std::uint32_t w = 0;
  absl::Status s = ReadAll(sock, &w, sizeof(w), deadline, "process 0");
  if (absl::IsUnavailable(s)) {
    return absl::PermissionDeniedError(
        "symmetric exchange: process 0 rejected this process (wrong token, or its index is "
        "taken)");
  }
  if (!s.ok()) return s;
  if (w != kWelcomeMagic) {
    return absl::DataLossError("symmetric exchange: process 0 answered with a malformed welcome");
  }
  return absl::OkStatus();
}

}  // namespace wire
}  // namespace cma
