// libFuzzer: whatever a connector sends, process 0's side of the rendezvous
// (the hello, then frames) never crashes, never accepts a hello without the
// token, and never allocates more than a frame's bounded size. The input
// goes through a real Unix socket pair; its first byte picks the reader.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "allocator/symmetric/wire.h"

namespace {
const std::string& Token() {
  static const std::string* t = new std::string(64, 'k');
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > 64 * 1024) return 0;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 0;
  // A socket buffer holds the whole input; then the writer hangs up.
  const ssize_t w = write(fds[1], data + 1, size - 1);
  close(fds[1]);
  if (w != static_cast<ssize_t>(size - 1)) {
    close(fds[0]);
    return 0;
  }
  const absl::Time deadline = absl::Now() + absl::Milliseconds(200);
  if (data[0] % 2 == 0) {
    absl::StatusOr<int> who = cma::wire::ReadHello(fds[0], Token(), 4, deadline);
    // Only a hello that carries the token may name a member.
    if (who.ok()) {
      const std::string input(reinterpret_cast<const char*>(data + 1), size - 1);
      if (input.find(Token()) == std::string::npos || *who < 1 || *who > 3) std::abort();
    }
  } else {
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<cma::Contribution> c = cma::wire::RecvFrame(fds[0], deadline, "fuzz");
      if (!c.ok()) break;
      if (c->bytes.size() > cma::kMaxFrameBytes) std::abort();
      cma::wire::CloseAll(c->fds);
    }
  }
  close(fds[0]);
  return 0;
}
