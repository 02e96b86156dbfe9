// libFuzzer: whatever a peer sends, either side of the rendezvous handshake
// and the frame reader never crash, never accept a peer that does not know
// the token, and never allocate more than a frame's bounded size. The input
// goes through a real Unix socket pair; its first byte picks the reader:
//   0: process 0 parses the input's start as a connector's hello and checks
//      the rest as its proof (a proof could verify only if the fuzzer found
//      an HMAC-SHA256 under a key it never sees: acceptance is a failure);
//   1: frames, as AllGather reads them;
//   2: a member's whole handshake against the input as process 0's
//      challenge (the member's nonce is fresh and random, so process 0's
//      proof can never verify: acceptance is a failure).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "allocator/symmetric/wire.h"

namespace {
const std::string& Token() {
  // A fixed token that passes the token rule (exchange.h), as MakeRendezvousToken's would.
  static const std::string* t =
      new std::string("c6cb7a1cb6719767d0c52cef6804a50e6bfd5940d6422705b421a4fead87c628");
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > 64 * 1024) return 0;
  const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(200);
  if (data[0] % 3 == 0) {
    absl::StatusOr<cma::wire::Hello> hello = cma::wire::ParseHello(
        input.substr(0, cma::wire::kHelloBytes), 4, getpid());
    if (hello.ok()) {
      if (hello->index < 1 || hello->index > 3) std::abort();
      const std::string proof = input.substr(cma::wire::kHelloBytes, cma::wire::kProofBytes);
      if (cma::wire::CheckProof(proof, Token(), *hello, std::string(cma::wire::kNonceBytes, 'n'))
              .ok()) {
        std::abort();
      }
    }
    return 0;
  }
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  // A socket buffer holds the whole input; then the writer hangs up (for the
  // member, after the handshake has read what it wants: its hello stays
  // unread, which a closed peer's socket tolerates).
  const ssize_t w = write(fds[1], input.data(), input.size());
  close(fds[1]);
  if (w != static_cast<ssize_t>(input.size())) {
    close(fds[0]);
    return 0;
  }
  if (data[0] % 3 == 1) {
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<cma::Contribution> c = cma::wire::RecvFrame(fds[0], deadline, "fuzz");
      if (!c.ok()) break;
      if (c->bytes.size() > cma::kMaxFrameBytes) std::abort();
      cma::wire::CloseAll(c->fds);
    }
  } else if (cma::wire::MemberHandshake(fds[0], 1, Token(), deadline).ok()) {
    std::abort();
  }
  close(fds[0]);
  return 0;
}
