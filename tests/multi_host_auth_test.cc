// Across hosts, in one process: the host backend's emulation of hosts and
// NVLink domains (what VmmImport refuses), and the leaders' round against
// a hostile store (altered, replayed or garbage messages are refused, never
// taken for a leader's word). Two "hosts" are two threads, each one
// process of its own host (MakeSingleProcessExchange), their leaders
// meeting through a framework-style all-gather (MakeCallbackByteExchange).
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "allocator/symmetric/multi_host.h"
#include "backends/host/host_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t kBytes = std::size_t{2} << 20;

HostBackendOptions On(const std::string& host, const std::string& domain) {
  HostBackendOptions o;
  o.device_count = 1;
  o.fabric_handles = true;
  o.host_id = host;
  o.fabric_domain = domain;
  return o;
}

// SCM_RIGHTS does not cross hosts: a POSIX FD exported on one emulated host
// is refused on another, naming both.
TEST(HostEmulationTest, PosixFdsServeOneHostOnly) {
  HostBackend a(On("hostA", "")), b(On("hostB", "")), a2(On("hostA", "")), plain;
  PhysicalHandle h = *a.VmmCreate(0, kBytes, HandleType::kPosixFd);
  ShareableHandle fd = *a.VmmExport(h, HandleType::kPosixFd);
  fd.bytes = kBytes;
  absl::StatusOr<PhysicalHandle> there = b.VmmImport(fd);
  EXPECT_EQ(there.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(there.status().message(), HasSubstr("emulated host 'hostA'"));
  EXPECT_THAT(there.status().message(), HasSubstr("emulated host 'hostB'"));
  EXPECT_EQ(plain.VmmImport(fd).status().code(), absl::StatusCode::kPermissionDenied);
  absl::StatusOr<PhysicalHandle> here = a2.VmmImport(fd);
  ASSERT_TRUE(here.ok()) << here.status();
  EXPECT_TRUE(a2.VmmRelease(*here).ok());
  // And the default host's memory is refused on a named one.
  PhysicalHandle p = *plain.VmmCreate(0, kBytes, HandleType::kPosixFd);
  ShareableHandle pfd = *plain.VmmExport(p, HandleType::kPosixFd);
  EXPECT_EQ(a.VmmImport(pfd).status().code(), absl::StatusCode::kPermissionDenied);
  close(pfd.fd);
  close(fd.fd);
  EXPECT_TRUE(plain.VmmRelease(p).ok());
  EXPECT_TRUE(a.VmmRelease(h).ok());
  HostBackend bad(On("no-dashes", ""));
  EXPECT_EQ(bad.VmmCreate(0, kBytes, HandleType::kPosixFd).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Fabric handles are names that only their emulated domain opens; the
// memory is shared; the name goes when its creator releases it.
TEST(HostEmulationTest, FabricHandlesOpenWithinTheirDomainOnly) {
  HostBackend a(On("hostA", "nvl0")), b(On("hostB", "nvl0")), c(On("hostC", "nvl1"));
  PhysicalHandle h = *a.VmmCreate(0, kBytes, HandleType::kFabric);
  ShareableHandle f = *a.VmmExport(h, HandleType::kFabric);
  ASSERT_EQ(f.type, HandleType::kFabric);
  f.bytes = kBytes;
  absl::StatusOr<PhysicalHandle> other = c.VmmImport(f);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(other.status().message(), HasSubstr("domain 'nvl0' cannot be opened in domain 'nvl1'"));
  absl::StatusOr<PhysicalHandle> in = b.VmmImport(f);
  ASSERT_TRUE(in.ok()) << in.status();
  // Both map it and see each other's writes.
  void* va = *a.VmmReserve(kBytes, 0);
  void* vb = *b.VmmReserve(kBytes, 0);
  ASSERT_TRUE(a.VmmMap(va, kBytes, h).ok());
  ASSERT_TRUE(b.VmmMap(vb, kBytes, *in).ok());
  ASSERT_TRUE(a.VmmSetAccess(va, kBytes, {0}).ok());
  ASSERT_TRUE(b.VmmSetAccess(vb, kBytes, {0}).ok());
  std::memset(va, 0x5a, 64);
  EXPECT_EQ(static_cast<unsigned char*>(vb)[63], 0x5a);
  // Wrong size, altered bytes: refused.
  ShareableHandle wrong = f;
  wrong.bytes = 2 * kBytes;
  EXPECT_EQ(b.VmmImport(wrong).status().code(), absl::StatusCode::kInvalidArgument);
  ShareableHandle garbage = f;
  garbage.fabric[0] ^= 1;
  EXPECT_EQ(b.VmmImport(garbage).status().code(), absl::StatusCode::kInvalidArgument);
  garbage = f;
  garbage.fabric[63] = 1;  // padding must be zero
  EXPECT_EQ(b.VmmImport(garbage).status().code(), absl::StatusCode::kInvalidArgument);
  garbage = f;
  garbage.fabric[40] ^= 1;  // another random name: nothing there
  EXPECT_EQ(b.VmmImport(garbage).status().code(), absl::StatusCode::kNotFound);
  // Released by its creator: the name is gone, the mappings stay.
  EXPECT_TRUE(a.VmmRelease(h).ok());
  EXPECT_EQ(b.VmmImport(f).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(static_cast<unsigned char*>(vb)[0], 0x5a);
  EXPECT_TRUE(b.VmmRelease(*in).ok());
  EXPECT_TRUE(a.VmmUnmap(va, kBytes).ok());
  EXPECT_TRUE(b.VmmUnmap(vb, kBytes).ok());
  EXPECT_TRUE(a.VmmFreeAddress(va, kBytes).ok());
  EXPECT_TRUE(b.VmmFreeAddress(vb, kBytes).ok());
  EXPECT_EQ(a.LiveResources(), HostResourceCounts{});
  EXPECT_EQ(b.LiveResources(), HostResourceCounts{});
  // No domain: fabric export fails as before (a device without an IMEX channel).
  HostBackend none(On("hostD", ""));
  PhysicalHandle n = *none.VmmCreate(0, kBytes, HandleType::kFabric);
  EXPECT_EQ(none.VmmExport(n, HandleType::kFabric).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(none.VmmRelease(n).ok());
}

// A framework-style all-gather among threads (fixed-size buffers).
class ThreadGather {
 public:
  explicit ThreadGather(int n) : n_(n), slots_(n) {}
  static int Callback(void* ctx, const void* send, size_t len, void* recv) {
    auto* p = static_cast<std::pair<ThreadGather*, int>*>(ctx);
    return p->first->Gather(p->second, send, len, recv);
  }

 private:
  int Gather(int i, const void* send, size_t len, void* recv) {
    absl::MutexLock l(&mu_);
    if (departed_) return -1;
    const std::uint64_t gen = gen_;
    slots_[i].assign(static_cast<const char*>(send), len);
    if (++arrived_ == n_) {
      result_.clear();
      for (const std::string& s : slots_) result_ += s;
      arrived_ = 0;
      ++gen_;
    } else {
      auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return gen_ != gen || departed_; };
      mu_.Await(absl::Condition(&done));
      if (gen_ == gen) return -1;  // a party left: this round never completes
    }
    std::memcpy(recv, result_.data(), result_.size());
    return 0;
  }

 public:
  // A party that is done: whoever waits for it fails (as a framework's
  // collective would when a rank exits).
  void Leave() {
    absl::MutexLock l(&mu_);
    departed_ = true;
  }

 private:
  bool departed_ = false;
  absl::Mutex mu_;
  const int n_;
  int arrived_ = 0;
  std::uint64_t gen_ = 0;
  std::vector<std::string> slots_;
  std::string result_;
};

// Between a leader and the store: alters what it receives in one round.
class Tamper final : public ByteExchange {
 public:
  using Edit = std::function<void(int round, std::vector<std::string>&)>;
  Tamper(std::unique_ptr<ByteExchange> inner, Edit edit)
      : inner_(std::move(inner)), edit_(std::move(edit)) {}
  int index() const override { return inner_->index(); }
  int count() const override { return inner_->count(); }
  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) override {
    absl::StatusOr<std::vector<std::string>> got = inner_->AllGather(mine);
    if (got.ok()) edit_(++round_, *got);
    return got;
  }

 private:
  std::unique_ptr<ByteExchange> inner_;
  Edit edit_;
  int round_ = 0;
};

// Two hosts of one process each; host 1's leader sees the store through
// `edit`. Returns each host's statuses: set-up, then two AllGathers.
std::vector<std::vector<absl::Status>> TwoHosts(const std::string& token1,
                                                const Tamper::Edit& edit,
                                                std::string token0 = std::string()) {
  if (token0.empty()) token0 = *MakeRendezvousToken();
  ThreadGather store(2);
  std::vector<std::vector<absl::Status>> out(2);
  auto host = [&](int i) {
    std::pair<ThreadGather*, int> ctx{&store, i};
    std::unique_ptr<ByteExchange> leaders =
        *MakeCallbackByteExchange(&ThreadGather::Callback, &ctx, i, 2);
    if (i == 1) leaders = std::make_unique<Tamper>(std::move(leaders), edit);
    auto x = MakeMultiHostExchange(MakeSingleProcessExchange(), std::move(leaders), i, 2,
                                   i == 1 && !token1.empty() ? token1 : token0);
    out[i].push_back(x.status());
    for (int round = 0; x.ok() && round < 2; ++round) {
      absl::StatusOr<std::vector<Contribution>> all =
          (*x)->AllGather({absl::StrCat("from ", i, " round ", round), {}});
      out[i].push_back(all.status());
      if (all.ok() && ((*all)[0].bytes != absl::StrCat("from 0 round ", round) ||
                       (*all)[1].bytes != absl::StrCat("from 1 round ", round))) {
        out[i].back() = absl::InternalError("wrong bytes");
      }
    }
    store.Leave();
  };
  std::thread t0(host, 0), t1(host, 1);
  t0.join();
  t1.join();
  return out;
}

TEST(LeadersRoundTest, AnHonestStoreCarriesEveryRound) {
  auto st = TwoHosts("", [](int, std::vector<std::string>&) {});
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(st[i].size(), 3u);
    for (const absl::Status& s : st[i]) EXPECT_TRUE(s.ok()) << "host " << i << ": " << s;
  }
}

TEST(LeadersRoundTest, AWrongTokenIsRefusedByBothSides) {
  auto st = TwoHosts(*MakeRendezvousToken(), [](int, std::vector<std::string>&) {});
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(st[i][0].code(), absl::StatusCode::kPermissionDenied) << st[i][0];
    EXPECT_THAT(st[i][0].message(), HasSubstr(absl::StrCat("host ", 1 - i, " did not prove")));
  }
}

// The store alters leader 0's first data round (round 4: after the proof's
// two and its verdict) on its way to leader 1: refused, not taken for
// leader 0's word; and leader 0, which saw nothing wrong, fails the round
// too (leader 1's verdict), so that no host goes on without the others.
TEST(LeadersRoundTest, AnAlteredRoundIsRefused) {
  auto st = TwoHosts("", [](int round, std::vector<std::string>& got) {
    if (round == 4) got[0][10] ^= 1;
  });
  ASSERT_GE(st[0].size(), 2u);
  EXPECT_TRUE(st[0][0].ok());
  EXPECT_EQ(st[0][1].code(), absl::StatusCode::kAborted) << st[0][1];
  EXPECT_THAT(st[0][1].message(), HasSubstr("leader 1 refused"));
  ASSERT_GE(st[1].size(), 2u);
  EXPECT_TRUE(st[1][0].ok());
  EXPECT_EQ(st[1][1].code(), absl::StatusCode::kPermissionDenied) << st[1][1];
  EXPECT_THAT(st[1][1].message(), HasSubstr("does not carry its MAC"));
  ASSERT_EQ(st[1].size(), 3u);
  EXPECT_EQ(st[1][2].code(), absl::StatusCode::kFailedPrecondition)
      << "a refused round breaks the exchange: " << st[1][2];
}

// A replay of leader 0's earlier round (its MAC names its round number).
TEST(LeadersRoundTest, AReplayedRoundIsRefused) {
  std::string first;
  auto st = TwoHosts("", [&](int round, std::vector<std::string>& got) {
    if (round == 4) first = got[0];
    if (round == 6) got[0] = first;
  });
  ASSERT_EQ(st[1].size(), 3u);
  EXPECT_TRUE(st[1][1].ok());
  EXPECT_EQ(st[1][2].code(), absl::StatusCode::kPermissionDenied) << st[1][2];
  EXPECT_FALSE(st[0][2].ok()) << "leader 0 fails the replayed round too";
}

// Set-up fails together too: leader 0's proof altered on its way to leader
// 1 only; leader 0 verifies leader 1's proof, yet hears leader 1's refusal
// in the proof's verdict round.
TEST(LeadersRoundTest, AnAlteredProofFailsSetUpOnEveryHost) {
  auto st = TwoHosts("", [](int round, std::vector<std::string>& got) {
    if (round == 2) got[0][0] ^= 1;
  });
  EXPECT_EQ(st[1][0].code(), absl::StatusCode::kPermissionDenied) << st[1][0];
  EXPECT_EQ(st[0][0].code(), absl::StatusCode::kAborted) << st[0][0];
}

// A forged verdict (the store turns leader 1's refusal into an ok) does not
// verify: leader 0 refuses it rather than go on alone.
TEST(LeadersRoundTest, AForgedVerdictIsRefused) {
  auto st = TwoHosts("", [](int round, std::vector<std::string>& got) {
    if (round == 5) got[0][0] ^= 1;  // leader 1 sees leader 0's verdict flipped
  });
  ASSERT_GE(st[1].size(), 2u);
  EXPECT_EQ(st[1][1].code(), absl::StatusCode::kPermissionDenied) << st[1][1];
  EXPECT_THAT(st[1][1].message(), HasSubstr("verdict of leader 0"));
}

// A refusal in set-up's verdict is bound to its session (to its sender's
// first message, with that leader's fresh nonce): one recorded from an
// earlier set-up with the same token (leader 0 refusing a host with another
// token) and replayed into a later one does not verify. Set-up still fails
// on host 1 (a verdict round tampered with), but as an unverified verdict,
// not as leader 0's refusal.
TEST(LeadersRoundTest, AReplayedSetUpRefusalDoesNotVerify) {
  const std::string token = *MakeRendezvousToken();
  std::string refusal;
  auto first = TwoHosts(*MakeRendezvousToken(), [&](int round, std::vector<std::string>& got) {
    if (round == 3) refusal = got[0];  // leader 0's verdict: it refused leader 1's proof
  }, token);
  ASSERT_EQ(first[0][0].code(), absl::StatusCode::kPermissionDenied) << first[0][0];
  ASSERT_FALSE(refusal.empty());
  ASSERT_EQ(refusal[0], '\0') << "a refusal";
  auto st = TwoHosts("", [&](int round, std::vector<std::string>& got) {
    if (round == 3) got[0] = refusal;
  }, token);
  ASSERT_FALSE(st[1].empty());
  EXPECT_EQ(st[1][0].code(), absl::StatusCode::kPermissionDenied) << st[1][0];
  EXPECT_THAT(st[1][0].message(), HasSubstr("verdict of leader 0"));
  EXPECT_THAT(st[1][0].message(), HasSubstr("does not verify"));
  EXPECT_THAT(st[1][0].message(), ::testing::Not(HasSubstr("refused leaders' round")));
}

// No attacker, three hosts, uneven contributions (600 KiB, 600 KiB, 10
// bytes): host 2's share of the round (the other two's) is over the frame
// limit. Every leader checks every host's share before it accepts, so the
// round fails on all three, not on host 2 alone.
TEST(LeadersRoundTest, AShareOverTheFrameLimitFailsEveryHost) {
  const std::string token = *MakeRendezvousToken();
  ThreadGather store(3);
  std::vector<absl::Status> out(3);
  auto host = [&](int i) {
    std::pair<ThreadGather*, int> ctx{&store, i};
    auto leaders = *MakeCallbackByteExchange(&ThreadGather::Callback, &ctx, i, 3);
    auto x = MakeMultiHostExchange(MakeSingleProcessExchange(), std::move(leaders), i, 3, token);
    if (x.ok()) {
      const std::size_t n = i == 2 ? 10 : 600 << 10;
      out[i] = (*x)->AllGather({std::string(n, 'x'), {}}).status();
    } else {
      out[i] = x.status();
    }
    store.Leave();
  };
  std::thread t0(host, 0), t1(host, 1), t2(host, 2);
  t0.join();
  t1.join();
  t2.join();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(out[i].code(), absl::StatusCode::kResourceExhausted) << "host " << i << ": " << out[i];
    EXPECT_THAT(out[i].message(), HasSubstr("host 2's share"));
  }
}

// Garbage in the proof's first round (too short, oversized counts): a clear
// refusal, never a read past the bytes.
TEST(LeadersRoundTest, GarbageInTheProofIsRefused) {
  for (const std::string& garbage : {std::string(), std::string("CMAL"), std::string(4096, '\xff')}) {
    auto st = TwoHosts("", [&](int round, std::vector<std::string>& got) {
      if (round == 1) got[0] = garbage;
    });
    EXPECT_FALSE(st[1][0].ok());
    EXPECT_TRUE(st[1][0].code() == absl::StatusCode::kPermissionDenied ||
                st[1][0].code() == absl::StatusCode::kDataLoss)
        << st[1][0];
  }
}

}  // namespace
}  // namespace cma
