// Issue 47 (security review), the symmetric heap's share: sizes whose
// stride computation would wrap, a member that announces a bad
// granularity, a handle of another heap, non_dumpable agreed by the group,
// and a process whose arguments are bad failing every process at Create.
// Each test failed before its fix (see the commit messages).
#include <sys/prctl.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/symmetric_process_util.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();

std::unique_ptr<SymmetricHeap> OneProcessHeap(HostBackend& b, int members,
                                              SymmetricOptions o = {}) {
  SymmetricGroup g;
  g.world_size = members;
  for (int r = 0; r < members; ++r) {
    g.local_ranks.push_back(r);
    g.local_devices.push_back(r);
  }
  auto h = SymmetricHeap::Create(b, g, MakeSingleProcessExchange(), o);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? std::move(*h) : nullptr;
}

// A size whose rounding wraps size_t once made a stride of one granule for
// a buffer that claimed nearly 2^64 bytes: Put, Python's arrays and kernels
// then wrote past every member's mapping. Refused now, changing nothing.
TEST(SymmetricSizeTest, ASizeWhoseStrideOverflowsIsRefusedAndChangesNothing) {
  for (const SymmetricProvider provider : {SymmetricProvider::kVmm, SymmetricProvider::kNvshmem}) {
    const int members = provider == SymmetricProvider::kVmm ? 2 : 1;
    HostBackend b({.device_count = 2});
    auto heap = OneProcessHeap(b, members, WithProvider(provider));
    ASSERT_NE(heap, nullptr);
    const std::int64_t calls = b.TotalCalls();
    std::vector<std::size_t> sizes = {kMax, kMax - 10, kMax - 255 - 256};
    // Two members: their strides together overflow the reservation.
    if (members == 2) sizes.insert(sizes.end(), {kMax / 2 + 1, kMax / 2 - (1 << 20)});
    for (const std::size_t bytes : sizes) {
      absl::StatusOr<SymmetricHandle> a = heap->Allocate(bytes);
      ASSERT_FALSE(a.ok()) << SymmetricProviderName(provider) << ": " << bytes << " bytes became "
                           << (*a)->bytes << " at a stride of " << (*a)->stride;
      EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
      EXPECT_THAT(a.status().message(), HasSubstr("too large")) << bytes;
      a = heap->Allocate(bytes, /*make_symmetric=*/true);
      EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bytes;
    }
    EXPECT_EQ(b.TotalCalls(), calls) << "a refused size reached the backend";
    EXPECT_EQ(heap->GetStats().allocations, 0);
    EXPECT_TRUE(heap->Snapshot().empty());
    // And the heap works.
    absl::StatusOr<SymmetricHandle> good = heap->Allocate(4096);
    ASSERT_TRUE(good.ok()) << good.status();
    EXPECT_LE((*good)->bytes + 256, (*good)->stride);
    ASSERT_TRUE(heap->Free(*good).ok());
    ASSERT_TRUE(heap->EmptyCache().ok());
  }
}

// make_symmetric takes the group's largest request: one member's huge one
// must fail every member, naming it, not become everyone's size.
TEST(SymmetricSizeTest, AHugeMakeSymmetricRequestFailsEveryMemberNamingIt) {
  for (const SymmetricProvider provider : {SymmetricProvider::kVmm, SymmetricProvider::kNvshmem}) {
    const std::string path =
        SocketPath(provider == SymmetricProvider::kVmm ? "huge-vmm" : "huge-shmem");
    auto codes = RunProcesses(2, [&](int r) {
      HostBackend b({.device_count = 1});
      auto heap = ProcessHeap(b, path, r, 2, kTimeout, WithProvider(provider));
      if (!heap) return false;
      const std::int64_t calls = b.TotalCalls();
      absl::StatusOr<SymmetricHandle> a =
          heap->Allocate(r == 1 ? kMax - 300 : 4096, /*make_symmetric=*/true);
      if (a.ok()) {
        std::fprintf(stderr, "rank %d: got %zu bytes at a stride of %zu\n", r, (*a)->bytes,
                     (*a)->stride);
        return false;
      }
      // Member 1 refuses its own request; the others hear it (kAborted),
      // naming member 1's process.
      const bool named =
          a.status().code() ==
              (r == 1 ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kAborted) &&
          absl::StrContains(a.status().message(), "too large") &&
          absl::StrContains(a.status().message(), r == 1 ? "request of" : "process 1");
      if (!named || b.TotalCalls() != calls || heap->GetStats().allocations != 0) {
        std::fprintf(stderr, "rank %d: %s\n", r, a.status().ToString().c_str());
        return false;
      }
      // Nothing changed: the next collective works.
      absl::StatusOr<SymmetricHandle> good = heap->Allocate(4096 * (r + 1), true);
      if (!good.ok() || (*good)->bytes != 8192 || (*good)->bytes + 256 > (*good)->stride) {
        return false;
      }
      return heap->Free(*good).ok() && heap->EmptyCache().ok();
    });
    EXPECT_THAT(codes, ::testing::Each(0)) << SymmetricProviderName(provider);
  }
}

// A peer that mirrors every round, but announces `granularity` in the sizes
// round (after the 14-byte tag: the size, then the granularity).
class GranularityPeer final : public Exchange {
 public:
  explicit GranularityPeer(std::uint64_t granularity) : granularity_(granularity) {}
  int process_count() const override { return 2; }
  int process_index() const override { return 0; }
  absl::StatusOr<std::vector<Contribution>> AllGather(const Contribution& mine) override {
    constexpr std::size_t kTag = 14;
    constexpr std::uint8_t kSizeRound = 1, kCreateRound = 13;
    Contribution peer{mine.bytes, {}};
    const std::uint8_t op = peer.bytes.size() > 4 ? peer.bytes[4] : 0;
    if (op == kSizeRound && peer.bytes.size() >= kTag + 16) {
      std::memcpy(&peer.bytes[kTag + 8], &granularity_, sizeof(granularity_));
    }
    if (op != kSizeRound && op != kCreateRound) {
      return absl::UnavailableError("only the create and size rounds are expected");
    }
    std::vector<Contribution> all(2);
    all[0].bytes = mine.bytes;
    for (int fd : mine.fds) all[0].fds.push_back(dup(fd));
    all[1] = std::move(peer);
    return all;
  }

 private:
  std::uint64_t granularity_;
};

TEST(SymmetricSizeTest, AGranularityAMemberAnnouncesIsChecked) {
  for (const std::uint64_t g : {std::uint64_t{0}, std::uint64_t{3}, std::uint64_t{3} << 20,
                                std::uint64_t{1} << 62, std::uint64_t{1} << 63}) {
    HostBackend b({.device_count = 1});
    auto heap = SymmetricHeap::Create(b, SymmetricGroup{2, {0}, {0}},
                                      std::make_unique<GranularityPeer>(g));
    ASSERT_TRUE(heap.ok()) << heap.status();
    const std::int64_t calls = b.TotalCalls();
    absl::Status s = (*heap)->Allocate(4096).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << g << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("process 1 announces a VMM granularity")) << g;
    EXPECT_EQ(b.TotalCalls(), calls) << g;
  }
}

// Generations restart in every heap and a heap looks a handle up by its
// address, where another heap's freed allocation may have been: a handle
// carries its heap, and every other heap refuses it.
TEST(SymmetricHandleTest, AHandleOfAnotherHeapIsRefusedAndFreesNothing) {
  HostBackend b({.device_count = 2});
  auto first = OneProcessHeap(b, 2);
  auto second = OneProcessHeap(b, 2);
  absl::StatusOr<SymmetricHandle> stale = first->Allocate(4096);
  ASSERT_TRUE(stale.ok());
  ASSERT_TRUE(first->Free(*stale).ok());
  ASSERT_TRUE(first->EmptyCache().ok());  // its entry is gone: the address may come back
  std::vector<SymmetricHandle> live;
  for (int i = 0; i < 16; ++i) {
    absl::StatusOr<SymmetricHandle> a = second->Allocate(4096 << i);
    ASSERT_TRUE(a.ok());
    live.push_back(*a);
  }
  int same_address = 0;
  for (const SymmetricHandle& h : live) same_address += h.allocation == stale->allocation;
  RecordProperty("address_reused", same_address);
  const absl::Status s = second->Free(*stale);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("another heap handed out"));
  EXPECT_EQ(second->Put(*stale, 0, 0, "x", 1).code(), absl::StatusCode::kInvalidArgument);
  // Nothing was freed: every allocation of the second heap is still live.
  for (const SymmetricSnapshot& v : second->Snapshot()) EXPECT_FALSE(v.cached) << v.id;
  EXPECT_EQ(second->GetStats().cached_bytes, 0);
  for (const SymmetricHandle& h : live) EXPECT_TRUE(second->Free(h).ok());
  first.reset();
  second.reset();
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
}

int Dumpable() { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0); }

// One member's non_dumpable protects its memory only if every process that
// maps it is non-dumpable too: the group takes the strictest.
TEST(SymmetricAgreementTest, NonDumpableIsTheGroupsStrictestChoice) {
  const std::string path = SocketPath("non-dumpable");
  auto codes = RunProcesses(3, [&](int r) {
    if (Dumpable() != 1) return false;
    HostBackend b({.device_count = 1});
    SymmetricOptions o;
    o.non_dumpable = r == 1;  // only member 1 asks
    auto heap = ProcessHeap(b, path, r, 3, kTimeout, o);
    if (!heap) return false;
    absl::StatusOr<SymmetricHandle> a = heap->Allocate(4096);
    if (!a.ok()) return false;
    if (Dumpable() != 0) {
      std::fprintf(stderr, "rank %d maps member 1's memory and is dumpable\n", r);
      return false;
    }
    if (!heap->Free(*a).ok() || !heap->EmptyCache().ok()) return false;
    return Dumpable() == 1;  // given back once the heap holds nothing
  });
  EXPECT_THAT(codes, ::testing::Each(0));
}

// A process whose arguments are bad fails Create on every process at once,
// naming it: before, it alone failed, and the others got a heap whose first
// collective waited out its timeout. Options the members must share are
// checked the same way.
TEST(SymmetricAgreementTest, BadArgumentsOnOneProcessFailCreateOnEveryProcess) {
  struct Case {
    const char* what;
    std::function<void(int rank, SymmetricGroup&, SymmetricOptions&)> edit;
    const char* says;  // in every process's error
  };
  const Case cases[] = {
      {"a rank out of range",
       [](int r, SymmetricGroup& g, SymmetricOptions&) {
         if (r == 1) g.local_ranks = {7};
       },
       "process 1"},
      {"another signal size",
       [](int r, SymmetricGroup&, SymmetricOptions& o) {
         if (r == 1) o.signal_bytes = 512;
       },
       "signal_bytes 512"},
      {"another world size",
       [](int r, SymmetricGroup& g, SymmetricOptions&) {
         if (r == 0) g.world_size = 3;
       },
       "world size 3"},
  };
  for (const Case& c : cases) {
    const std::string path = SocketPath("create-args");
    const absl::Time start = absl::Now();
    auto codes = RunProcesses(2, [&](int r) {
      HostBackend b({.device_count = 1});
      auto x = MakeUnixSocketExchange(path, r, 2, kTimeout, Token());
      if (!x.ok()) return false;
      SymmetricGroup g{2, {r}, {0}};
      SymmetricOptions o;
      c.edit(r, g, o);
      auto heap = SymmetricHeap::Create(b, g, std::move(*x), o);
      if (heap.ok()) {
        std::fprintf(stderr, "%s: rank %d got a heap\n", c.what, r);
        return false;
      }
      if (!absl::StrContains(heap.status().message(), c.says) &&
          !(r == 1 && absl::StrContains(heap.status().message(), "out of range"))) {
        std::fprintf(stderr, "%s: rank %d: %s\n", c.what, r, heap.status().ToString().c_str());
        return false;
      }
      return b.LiveResources() == HostResourceCounts{};
    });
    EXPECT_THAT(codes, ::testing::Each(0)) << c.what;
    EXPECT_LT(absl::Now() - start, kTimeout / 2) << c.what << ": failed at once, not at a timeout";
  }
}

}  // namespace
}  // namespace cma
