// Process 0's side of the socket rendezvous: admitting the members that
// prove themselves (wire.h's handshake) while turning away everyone else,
// and telling the members let in when the rendezvous fails.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/symmetric/socket_rendezvous.h"
#include "allocator/symmetric/wire.h"

namespace cma {
namespace rendezvous {
namespace {

using wire::Errno;

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

}  // namespace

// Process 0: accepts until every member has proved it knows the token and
// claimed a free index. Every pending connector is read at once, each
// against its own deadline; anything else is closed and the wait goes on.
// A connector is sent nothing until its hello is well formed and comes from
// the process it names; then only our challenge and proof, and the reason
// if we reject it.
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
  // `hello`: the connector's hello, when the verdict comes in place of our
  // challenge (then it carries our MAC: wire.h).
  auto reject = [&](std::size_t i, std::string why, bool tell,
                    const wire::Hello* hello = nullptr) {
    ++rejected;
    if (tell) {
      const absl::Status status = absl::PermissionDeniedError(why);
      const std::string v = hello != nullptr ? wire::SignedVerdict(status, token, *hello)
                                             : wire::Verdict(status);
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
               /*tell=*/true, &*h);
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

}  // namespace rendezvous
}  // namespace cma
