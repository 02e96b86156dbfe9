// libFuzzer: the symmetric heap's collective rounds against a peer that
// sends anything. A two-process group whose other member is the fuzzer: in
// every round its contribution (bytes, and how many descriptors ride along)
// comes from the input, optionally behind this round's valid tag so that the
// parsing past the tag is reached too. The input also picks the heap's calls
// (Allocate with sizes that hit and miss the cache, make_symmetric, Free,
// EmptyCache), after Create's own round, whose contribution comes from the
// input like any other. Whatever the peer sends, the heap never crashes, never keeps
// a descriptor it was sent, and releases everything when destroyed.
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/host/host_backend.h"

namespace {

struct Reader {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t Byte() { return n ? (--n, *p++) : 0; }
  std::string Bytes(std::size_t k) {
    k = std::min(k, n);
    std::string out(reinterpret_cast<const char*>(p), k);
    p += k;
    n -= k;
    return out;
  }
};

int OpenFds() {
  int count = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++count;
  closedir(d);
  return count;
}

// This process is member 0 of 2; member 1 says what the input says.
class FuzzedPeer final : public cma::Exchange {
 public:
  explicit FuzzedPeer(Reader& in) : in_(in) {}
  int process_count() const override { return 2; }
  int process_index() const override { return 0; }
  absl::StatusOr<std::vector<cma::Contribution>> AllGather(const cma::Contribution& mine) override {
    const std::uint8_t how = in_.Byte();
    if (how == 0xff) return absl::UnavailableError("fuzzed peer went away");
    cma::Contribution peer;
    // The round's tag (magic, op, ok, sequence: 14 bytes) copied from ours,
    // or not, then whatever the input says.
    if (how & 1) peer.bytes = mine.bytes.substr(0, std::min<std::size_t>(14, mine.bytes.size()));
    if (how & 2) peer.bytes += mine.bytes.substr(std::min<std::size_t>(14, mine.bytes.size()));
    peer.bytes += in_.Bytes(in_.Byte());
    for (int k = (how >> 2) & 3; k > 0; --k) peer.fds.push_back(memfd_create("peer", MFD_CLOEXEC));
    std::vector<cma::Contribution> all(2);
    all[0].bytes = mine.bytes;
    for (int fd : mine.fds) all[0].fds.push_back(dup(fd));  // as a real exchange returns them
    all[1] = std::move(peer);
    return all;
  }

 private:
  Reader& in_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > 4096) return 0;
  const int fds_before = OpenFds();
  {
    Reader in{data, size};
    cma::HostBackend host({.device_count = 1});
    {
      cma::SymmetricGroup group{2, {0}, {0}};
      // Create's round is the peer's first: what it sends may refuse the
      // heap (then nothing may be kept either).
      auto heap = cma::SymmetricHeap::Create(host, group, std::make_unique<FuzzedPeer>(in));
      std::vector<cma::SymmetricHandle> live;
      for (int step = 0; heap.ok() && step < 16 && in.n > 0; ++step) {
        const std::uint8_t op = in.Byte();
        if (op % 4 <= 1) {
          static constexpr std::size_t kSizes[] = {1, 4096, 1 << 20, 3 << 20};
          auto a = (*heap)->Allocate(kSizes[(op >> 2) % 4], op % 4 == 1);
          if (a.ok()) {
            if ((*a)->peers.size() != 2 || (*a)->bytes == 0) std::abort();
            live.push_back(*a);
          }
        } else if (op % 4 == 2 && !live.empty()) {
          if (!(*heap)->Free(live.back()).ok()) std::abort();
          live.pop_back();
        } else {
          (void)(*heap)->EmptyCache();
        }
      }
    }
    if (!(host.LiveResources() == cma::HostResourceCounts{})) std::abort();
  }
  if (OpenFds() != fds_before) std::abort();  // a descriptor the peer sent was kept
  return 0;
}
