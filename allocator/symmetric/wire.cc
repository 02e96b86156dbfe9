// The rendezvous wire protocol: frames carrying bytes and FDs, and the
// authenticated hello a connecting member sends first.
#include "allocator/symmetric/wire.h"

#include <fcntl.h>
#include <sodium.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace cma {
namespace wire {
namespace {

constexpr std::uint32_t kMagic = 0x434d4158;       // "CMAX": a frame
constexpr std::uint32_t kHelloMagic = 0x434d4148;  // "CMAH": a member's hello
constexpr std::uint32_t kChallengeMagic = 0x434d4143;  // "CMAC": process 0's challenge and proof
constexpr std::uint32_t kProofMagic = 0x434d4150;      // "CMAP": a member's proof
constexpr std::uint32_t kVerdictMagic = 0x434d4156;    // "CMAV": process 0's verdict
constexpr std::uint32_t kSignedVerdictMagic = 0x434d4157;  // "CMAW": one with process 0's MAC
// 3: mutual HMAC challenge-response; 4: verdicts; 5: a verdict on a hello
// carries process 0's MAC.
constexpr std::uint32_t kVersion = 5;

struct Header {
  std::uint32_t magic;
  std::uint32_t ok;  // 0: an error frame whose bytes are the reason
  std::uint32_t bytes;
  std::uint32_t fds;
};

template <typename T>
void Put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
void Get(const std::string& in, std::size_t& pos, T& v) {
  std::memcpy(&v, in.data() + pos, sizeof(v));  // callers size `in` first
  pos += sizeof(v);
}

// What a member checks a verdict on its hello against: it comes before
// process 0 has proved anything, so it must carry process 0's MAC.
struct VerdictKey {
  const std::string& token;
  std::int32_t index;
  absl::string_view nonce;  // the member's
};
absl::Status UnverifiedVerdict(pid_t pid) {
  return absl::PermissionDeniedError(absl::StrFormat(
      "symmetric exchange: the process listening (pid %d) answered our hello with a verdict "
      "whose MAC does not verify, so it does not know the rendezvous token (an impostor holding "
      "the socket, or this process was given another token); its claim is ignored",
      pid));
}

// Reads the rest of a verdict whose header is `header`: its status (below).
// With `key`, a verdict whose MAC does not verify is kPermissionDenied,
// never its claimed status.
absl::Status VerdictAfter(int sock, const std::string& header, absl::Time deadline, pid_t pid,
                          const VerdictKey* key = nullptr);

}  // namespace

void CloseAll(std::vector<int>& fds) {
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  fds.clear();
}

std::string HmacSha256(absl::string_view key, absl::string_view msg) {
  unsigned char out[kMacBytes];
  crypto_auth_hmacsha256_state st;
  if (crypto_auth_hmacsha256_init(&st, reinterpret_cast<const unsigned char*>(key.data()),
                                  key.size()) != 0 ||
      crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(msg.data()),
                                    msg.size()) != 0 ||
      crypto_auth_hmacsha256_final(&st, out) != 0) {
    return std::string();  // matches no MAC
  }
  return std::string(reinterpret_cast<const char*>(out), kMacBytes);
}

bool MacMatches(absl::string_view got, const std::string& want) {
  return want.size() == kMacBytes && got.size() == kMacBytes &&
         sodium_memcmp(got.data(), want.data(), kMacBytes) == 0;
}

void ShutdownAll(std::vector<int>& fds) {
  for (int& fd : fds) {
    if (fd >= 0) {
      shutdown(fd, SHUT_RDWR);
      close(fd);
      fd = -1;
    }
  }
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
    // At most a minute per poll: an infinite or huge deadline must neither
    // overflow poll's int (which made it spin) nor sleep past a re-check.
    const std::int64_t ms = std::min<std::int64_t>(absl::ToInt64Milliseconds(left), 60'000) + 1;
    const int r = poll(&p, 1, static_cast<int>(ms));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("poll");
    if (r == 0) continue;  // re-check the deadline
    // An error (a peer that closed with our bytes unread) but data still
    // queued: the read gets the data first (a verdict sent before the close).
    if ((p.revents & events) == 0 && (p.revents & (POLLERR | POLLNVAL))) {
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
  ssize_t w;
  for (;;) {
    if (absl::Status s = WaitFor(sock, POLLOUT, deadline, who); !s.ok()) return s;
    w = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;  // sockets may be non-blocking
    break;
  }
  if (w <= 0) {
    return absl::UnavailableError(absl::StrCat("symmetric exchange: ", who, " disconnected"));
  }
  // The FDs went with the first byte; a short write leaves only bytes.
  const std::size_t sent = static_cast<std::size_t>(w);
  if (sent < sizeof(h)) {
    if (absl::Status s = WriteAll(sock, reinterpret_cast<const char*>(&h) + sent,
                                  sizeof(h) - sent, deadline, who);
        !s.ok()) {
      return s;
    }
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
  ssize_t r;
  for (;;) {
    if (absl::Status s = WaitFor(sock, POLLIN, deadline, who); !s.ok()) return s;
    r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    break;
  }
  if (r < 0) return Errno(absl::StrCat("symmetric exchange: receiving from ", who));
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
  if (r > 0 && static_cast<std::size_t>(r) < sizeof(h)) {  // a short read: the rest is bytes
    if (absl::Status s = ReadAll(sock, reinterpret_cast<char*>(&h) + r, sizeof(h) - r, deadline,
                                 who);
        !s.ok()) {
      CloseAll(c.fds);
      return s;
    }
    r = sizeof(h);
  }
  if (r == static_cast<ssize_t>(sizeof(h)) && h.magic == kVerdictMagic) {
    // Process 0 ends the rendezvous for us instead of welcoming us.
    CloseAll(c.fds);
    absl::StatusOr<ucred> peer = PeerCred(sock);
    return VerdictAfter(sock, std::string(reinterpret_cast<const char*>(&h), sizeof(h)), deadline,
                        peer.ok() ? peer->pid : 0);
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

absl::StatusOr<ucred> PeerCred(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return Errno("SO_PEERCRED");
  return cred;
}

absl::Status CryptoReady() {
  // libsodium asks for sodium_init before any other call; it is idempotent
  // and thread-safe, and costs a few microseconds once per process.
  static const int ready = sodium_init();
  if (ready < 0) {
    return absl::InternalError("symmetric exchange: libsodium failed to initialise (sodium_init)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomBytes(std::size_t n) {
  std::string out(n, '\0');
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Errno("getrandom");
    got += static_cast<std::size_t>(r);
  }
  return out;
}

namespace {

// The HMAC state keyed with `token` (its inner and outer pads already
// hashed): computed once per token and copied for each MAC, so that a MAC
// of the handshake's one-block message costs two SHA-256 blocks, not four.
// A process meets few tokens (one per rendezvous): one cached is enough.
bool KeyedState(const std::string& token, crypto_auth_hmacsha256_state* st) {
  static absl::Mutex mu;
  static std::string* cached_token ABSL_GUARDED_BY(mu) = new std::string();
  static crypto_auth_hmacsha256_state cached ABSL_GUARDED_BY(mu);
  absl::MutexLock l(&mu);
  if (*cached_token != token || cached_token->empty()) {
    if (!CryptoReady().ok() ||
        crypto_auth_hmacsha256_init(&cached, reinterpret_cast<const unsigned char*>(token.data()),
                                    token.size()) != 0) {
      cached_token->clear();
      return false;
    }
    *cached_token = token;
  }
  *st = cached;
  return true;
}

// HMAC-SHA256 under the token of a label and the handshake's fields: the
// label keeps process 0's MAC from passing for a member's and back. The
// message (52 bytes) fits one SHA-256 block with its padding.
std::string Mac(const std::string& token, absl::string_view label, std::int32_t index,
                std::int32_t pid, absl::string_view first_nonce, absl::string_view second_nonce) {
  std::string msg(label);
  Put(msg, kVersion);
  Put(msg, index);
  Put(msg, pid);
  msg.append(first_nonce.data(), first_nonce.size());
  msg.append(second_nonce.data(), second_nonce.size());
  // libsodium's HMAC keeps its state on the stack: no heap, no global
  // state to fault in after a fork (see CryptoReady).
  unsigned char out[crypto_auth_hmacsha256_BYTES];
  crypto_auth_hmacsha256_state st;
  if (!KeyedState(token, &st) ||
      crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(msg.data()),
                                    msg.size()) != 0 ||
      crypto_auth_hmacsha256_final(&st, out) != 0) {
    return std::string();  // matches no MAC: a failure to compute rejects
  }
  static_assert(crypto_auth_hmacsha256_BYTES == kMacBytes);
  return std::string(reinterpret_cast<const char*>(out), sizeof(out));
}

bool MacsEqual(absl::string_view a, const std::string& b) {
  return b.size() == kMacBytes && a.size() == kMacBytes &&
         sodium_memcmp(a.data(), b.data(), kMacBytes) == 0;  // constant time
}

constexpr char kRootLabel[] = "cma-root";  // 8 bytes: keeps the message in one block
constexpr char kMemberLabel[] = "cma-memb";
constexpr char kVerdictLabel[] = "cma-verd";

// What a verdict's MAC covers besides the handshake's fields.
std::string VerdictBody(std::uint32_t code, absl::string_view reason) {
  std::string out;
  Put(out, code);
  out.append(reason.data(), reason.size());
  return out;
}

}  // namespace

absl::Status ProcessZeroLeft(pid_t pid, absl::string_view when) {
  return absl::UnavailableError(absl::StrFormat(
      "symmetric exchange: process 0 (pid %d) closed the connection %s without a verdict: it "
      "exited or was killed (a rejection would have said why)",
      pid, when));
}

namespace {

// The rest of a verdict whose header (kVerdictHeaderBytes) is in `header`.
absl::Status VerdictAfter(int sock, const std::string& header, absl::Time deadline, pid_t pid,
                          const VerdictKey* key) {
  std::size_t pos = 0;
  std::uint32_t magic = 0, version = 0, code = 0, len = 0;
  Get(header, pos, magic);
  Get(header, pos, version);
  Get(header, pos, code);
  Get(header, pos, len);
  if (magic != (key != nullptr ? kSignedVerdictMagic : kVerdictMagic) || version != kVersion ||
      len > kMaxReasonBytes ||
      code == 0 || code > static_cast<std::uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::DataLossError(absl::StrFormat(
        "symmetric exchange: a malformed verdict from process 0 (magic %#x, version %d, code %d, "
        "%d bytes)",
        magic, version, code, len));
  }
  std::string reason(len, '\0');
  absl::Status s = ReadAll(sock, reason.data(), len, deadline, "process 0");
  if (absl::IsUnavailable(s)) return ProcessZeroLeft(pid, "in the middle of its verdict");
  if (!s.ok()) return s;
  if (key != nullptr) {
    std::string mac(kMacBytes, '\0');
    s = ReadAll(sock, mac.data(), mac.size(), deadline, "process 0");
    if (!s.ok() && !absl::IsUnavailable(s)) return s;
    if (!s.ok() || !MacsEqual(mac, Mac(key->token, kVerdictLabel, key->index, pid, key->nonce,
                                       VerdictBody(code, reason)))) {
      return UnverifiedVerdict(pid);
    }
  }
  return absl::Status(static_cast<absl::StatusCode>(code),
                      absl::StrCat("symmetric exchange: process 0 (pid ", pid,
                                   ") ended the rendezvous for this process: ", reason));
}

}  // namespace

namespace {

std::string VerdictWith(std::uint32_t magic, const absl::Status& status) {
  const std::string reason(status.message().substr(0, kMaxReasonBytes));
  std::string out;
  Put(out, magic);
  Put(out, kVersion);
  // An OK status is no verdict: it would read as malformed.
  Put(out, static_cast<std::uint32_t>(status.code()));
  Put(out, static_cast<std::uint32_t>(reason.size()));
  return out + reason;
}

}  // namespace

std::string Verdict(const absl::Status& status) { return VerdictWith(kVerdictMagic, status); }

std::string SignedVerdict(const absl::Status& status, const std::string& token,
                          const Hello& hello) {
  const std::string reason(status.message().substr(0, kMaxReasonBytes));
  return VerdictWith(kSignedVerdictMagic, status) + Mac(token, kVerdictLabel, hello.index, getpid(), hello.nonce,
                               VerdictBody(static_cast<std::uint32_t>(status.code()), reason));
}

absl::Status MemberHandshake(int sock, int index, const std::string& token, absl::Time deadline) {
  // Our handles go only to a process 0 of our own user that knows the token.
  absl::StatusOr<ucred> peer = PeerCred(sock);
  if (!peer.ok()) return peer.status();
  if (peer->uid != geteuid()) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "symmetric exchange: the process listening runs as uid %d, not this user (%d)", peer->uid,
        geteuid()));
  }
  absl::StatusOr<std::string> nonce = RandomBytes(kNonceBytes);
  if (!nonce.ok()) return nonce.status();
  const std::int32_t my_pid = getpid();
  std::string hello;
  Put(hello, kHelloMagic);
  Put(hello, kVersion);
  Put(hello, static_cast<std::int32_t>(index));
  Put(hello, my_pid);
  hello += *nonce;
  absl::Status s = WriteAll(sock, hello.data(), hello.size(), deadline, "process 0");
  if (!s.ok()) return s;
  // A challenge, or a verdict in its place (a rejection) with the same
  // header size; a close without either is process 0 going away.
  std::string challenge(kChallengeBytes, '\0');
  s = ReadAll(sock, challenge.data(), kVerdictHeaderBytes, deadline, "process 0");
  if (absl::IsUnavailable(s)) return ProcessZeroLeft(peer->pid, "before answering our hello");
  if (!s.ok()) return s;
  std::uint32_t first = 0;
  std::memcpy(&first, challenge.data(), sizeof(first));
  // Whoever holds the socket could send a verdict here: only process 0's
  // MAC makes it process 0's word.
  if (first == kVerdictMagic) return UnverifiedVerdict(peer->pid);
  if (first == kSignedVerdictMagic) {
    const VerdictKey key{token, index, *nonce};
    return VerdictAfter(sock, challenge, deadline, peer->pid, &key);
  }
  s = ReadAll(sock, challenge.data() + kVerdictHeaderBytes, kChallengeBytes - kVerdictHeaderBytes,
              deadline, "process 0");
  if (absl::IsUnavailable(s)) return ProcessZeroLeft(peer->pid, "in the middle of its challenge");
  if (!s.ok()) return s;
  std::size_t pos = 0;
  std::uint32_t magic = 0, version = 0;
  std::int32_t root_pid = 0, reserved = 0;
  Get(challenge, pos, magic);
  Get(challenge, pos, version);
  Get(challenge, pos, root_pid);
  Get(challenge, pos, reserved);
  if (magic != kChallengeMagic || version != kVersion) {
    return absl::DataLossError(absl::StrFormat(
        "symmetric exchange: the listener is not a cma process 0 of this version (magic %#x, "
        "version %d; expected %#x, %d)",
        magic, version, kChallengeMagic, kVersion));
  }
  const absl::string_view root_nonce = absl::string_view(challenge).substr(pos, kNonceBytes);
  if (!MacsEqual(absl::string_view(challenge).substr(pos + kNonceBytes),
                 Mac(token, kRootLabel, index, root_pid, *nonce, root_nonce))) {
    return absl::PermissionDeniedError(
        "symmetric exchange: the process listening did not prove that it knows the rendezvous "
        "token (or this process was given another token)");
  }
  if (root_pid != peer->pid) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "symmetric exchange: process 0's proof names process %d but the socket's peer is "
        "process %d (a relay?)",
        root_pid, peer->pid));
  }
  // Our proof; process 0 closes on us if it does not verify, which our
  // first AllGather reports.
  std::string proof;
  Put(proof, kProofMagic);
  proof += Mac(token, kMemberLabel, index, my_pid, root_nonce, *nonce);
  return WriteAll(sock, proof.data(), proof.size(), deadline, "process 0");
}

absl::StatusOr<Hello> ParseHello(absl::string_view hello, int process_count, pid_t peer_pid) {
  if (hello.size() != kHelloBytes) {
    return absl::PermissionDeniedError(
        absl::StrFormat("a hello of %d bytes (expected %d)", hello.size(), kHelloBytes));
  }
  const std::string h(hello);
  std::size_t pos = 0;
  std::uint32_t magic = 0, version = 0;
  std::int32_t index = 0, pid = 0;
  Get(h, pos, magic);
  Get(h, pos, version);
  Get(h, pos, index);
  Get(h, pos, pid);
  if (magic != kHelloMagic || version != kVersion) {
    return absl::PermissionDeniedError("not a cma member's hello (wrong magic or version)");
  }
  if (pid != peer_pid) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "the hello names process %d but the socket's peer is process %d (a relay?)", pid,
        peer_pid));
  }
  if (index <= 0 || index >= process_count) {
    return absl::PermissionDeniedError(absl::StrFormat("bad process index %d", index));
  }
  return Hello{index, pid, h.substr(pos, kNonceBytes)};
}

std::string Challenge(const std::string& token, const Hello& hello, const std::string& nonce) {
  const std::int32_t me = getpid();
  std::string out;
  Put(out, kChallengeMagic);
  Put(out, kVersion);
  Put(out, me);
  Put(out, std::int32_t{0});
  out += nonce;
  out += Mac(token, kRootLabel, hello.index, me, hello.nonce, nonce);
  return out;
}

absl::Status CheckProof(absl::string_view proof, const std::string& token, const Hello& hello,
                        const std::string& nonce) {
  std::uint32_t magic = 0;
  if (proof.size() != kProofBytes) {
    return absl::PermissionDeniedError(
        absl::StrFormat("a proof of %d bytes (expected %d)", proof.size(), kProofBytes));
  }
  std::memcpy(&magic, proof.data(), sizeof(magic));
  if (magic != kProofMagic ||
      !MacsEqual(proof.substr(sizeof(magic)),
                 Mac(token, kMemberLabel, hello.index, hello.pid, nonce, hello.nonce))) {
    return absl::PermissionDeniedError("wrong token (the member's proof does not verify)");
  }
  return absl::OkStatus();
}

}  // namespace wire
}  // namespace cma
