// The C ABI's symmetric heap across hosts (cma_c.h:
// cma_symmetric_create_multi_host): every process's host id and verdict
// gathered through the framework's all-gather, each host's rendezvous
// carved out of it, the leaders' all-gather beside it.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/multi_host.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "allocator/symmetric/wire.h"
#include "integrations/c/cma_c.h"
#include "integrations/c/cma_c_internal.h"

namespace {

using cma::capi::Fail;

// A leaders' ByteExchange of one party (every process on one host).
class SoloByteExchange : public cma::ByteExchange {
 public:
  int index() const override { return 0; }
  int count() const override { return 1; }
  absl::StatusOr<std::vector<std::string>> AllGather(const std::string& mine) override {
    return std::vector<std::string>{mine};
  }
};

// One host's all-gather carved out of the caller's all-gather of every
// process: every process of every host calls it at the same point (each
// host's MakeCallbackExchange uses its callback once), and each keeps its
// own host's parts, in process order.
struct HostGather {
  cma_allgather_fn all = nullptr;
  void* ctx = nullptr;
  int process_count = 0;
  std::vector<int> members;  // this host's processes, ascending
};

int HostAllGather(void* ctx, const void* send, size_t len, void* recv) {
  auto* g = static_cast<HostGather*>(ctx);
  std::vector<char> all(len * static_cast<std::size_t>(g->process_count));
  if (g->all(g->ctx, send, len, all.data()) != 0) return 1;
  char* out = static_cast<char*>(recv);
  for (std::size_t i = 0; i < g->members.size(); ++i) {
    std::memcpy(out + i * len, all.data() + static_cast<std::size_t>(g->members[i]) * len, len);
  }
  return 0;
}

// What every process says about itself before the set-up (fixed size):
// whether its own arguments passed, whether it has a leaders' callback,
// and its host id (NUL-padded).
constexpr std::size_t kMaxHostId = 64;
struct HostRecord {
  char ok;
  char has_leaders;
  char host[kMaxHostId];
};

}  // namespace

extern "C" {

cma_symmetric_heap* cma_symmetric_create_multi_host(
    int world_size, const int* local_ranks, const int* local_devices, int n_local,
    int process_index, int process_count, const char* host_id, const char* token,
    cma_allgather_fn allgather, void* ctx, cma_allgather_fn leaders_allgather, void* leaders_ctx,
    double timeout_seconds, const char* options) {
  constexpr const char* kWho = "cma_symmetric_create_multi_host";
  cma::CachingManagedAllocator* a = cma::capi::Get();
  if (a == nullptr) return nullptr;
  // Without a valid all-gather nothing can be shared: refused at once.
  if (allgather == nullptr || process_count < 1 || process_index < 0 ||
      process_index >= process_count) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        kWho, ": needs an allgather callback among every process and 0 <= process_index (",
        process_index, ") < process_count (", process_count, ")")));
    return nullptr;
  }
  // Every other check is local; its verdict is gathered with the host ids,
  // so that a process with bad arguments fails every process at once
  // rather than leaving the others to their timeout.
  absl::Status mine = cma::capi::CheckSymmetricCreate(kWho, world_size, local_ranks, local_devices, n_local,
                                  timeout_seconds);
  const std::size_t host_len = host_id == nullptr ? 0 : std::strlen(host_id);
  if (mine.ok() && (host_len == 0 || host_len > kMaxHostId)) {
    mine = absl::InvalidArgumentError(absl::StrCat(
        kWho, ": host_id must be 1 to ", kMaxHostId,
        " bytes naming this process's host (the same string on every process of a host)"));
  }
  if (mine.ok()) {
    mine = token == nullptr ? absl::InvalidArgumentError("no token") : cma::wire::CheckToken(token);
    if (!mine.ok()) {
      mine = absl::InvalidArgumentError(absl::StrCat(
          kWho, ": the token (the same on every process, from the launcher): ", mine.message()));
    }
  }
  absl::StatusOr<cma::SymmetricOptions> opts = cma::capi::ParseSymmetricOptions(options);
  if (mine.ok() && !opts.ok()) mine = opts.status();
  HostRecord rec{};
  rec.ok = mine.ok() ? 1 : 0;
  rec.has_leaders = leaders_allgather != nullptr ? 1 : 0;
  if (host_id != nullptr) std::memcpy(rec.host, host_id, std::min(host_len, kMaxHostId));
  std::vector<HostRecord> all(static_cast<std::size_t>(process_count));
  if (allgather(ctx, &rec, sizeof(rec), all.data()) != 0) {
    Fail(absl::UnavailableError(absl::StrCat(kWho, ": the allgather callback failed")));
    return nullptr;
  }
  if (!mine.ok()) {
    Fail(mine);
    return nullptr;
  }
  // Hosts in the order of their first process; each host's leader is its
  // first process.
  std::vector<std::string> hosts;
  std::vector<int> host_of(static_cast<std::size_t>(process_count));
  for (int p = 0; p < process_count; ++p) {
    const HostRecord& r = all[static_cast<std::size_t>(p)];
    if (r.ok == 0) {
      Fail(absl::FailedPreconditionError(absl::StrCat(
          kWho, ": process ", p, " refused its own arguments (its error says why)")));
      return nullptr;
    }
    const std::string h(r.host, strnlen(r.host, kMaxHostId));
    auto it = std::find(hosts.begin(), hosts.end(), h);
    host_of[static_cast<std::size_t>(p)] = static_cast<int>(it - hosts.begin());
    if (it == hosts.end()) hosts.push_back(h);
  }
  const int host_count = static_cast<int>(hosts.size());
  const int my_host = host_of[static_cast<std::size_t>(process_index)];
  HostGather g;
  g.all = allgather;
  g.ctx = ctx;
  g.process_count = process_count;
  for (int p = 0; p < process_count; ++p) {
    if (host_of[static_cast<std::size_t>(p)] == my_host) g.members.push_back(p);
    const bool leads = std::find(host_of.begin(), host_of.begin() + p,
                                 host_of[static_cast<std::size_t>(p)]) == host_of.begin() + p;
    if (host_count > 1 && leads && all[static_cast<std::size_t>(p)].has_leaders == 0) {
      Fail(absl::InvalidArgumentError(absl::StrCat(
          kWho, ": process ", p, " leads host '", hosts[host_of[static_cast<std::size_t>(p)]],
          "' (its first process) of ", host_count, " hosts but passed no leaders_allgather")));
      return nullptr;
    }
  }
  const int local_index = static_cast<int>(
      std::find(g.members.begin(), g.members.end(), process_index) - g.members.begin());
  const absl::Duration timeout = absl::Seconds(timeout_seconds);
  auto host_x = cma::MakeCallbackExchange(HostAllGather, &g, local_index,
                                          static_cast<int>(g.members.size()), timeout);
  if (!host_x.ok()) {
    Fail(host_x.status());
    return nullptr;
  }
  std::unique_ptr<cma::ByteExchange> leaders;
  if (local_index == 0) {
    if (host_count == 1) {
      leaders = std::make_unique<SoloByteExchange>();
    } else {
      auto l = cma::MakeCallbackByteExchange(leaders_allgather, leaders_ctx, my_host, host_count);
      if (!l.ok()) {
        Fail(l.status());
        return nullptr;
      }
      leaders = std::move(*l);
    }
  }
  auto x = cma::MakeMultiHostExchange(std::move(*host_x), std::move(leaders), process_index,
                                      process_count, token);
  if (!x.ok()) {
    Fail(x.status());
    return nullptr;
  }
  const cma::SymmetricGroup group = cma::capi::SymmetricGroupOf(world_size, local_ranks, local_devices, n_local);
  auto heap = cma::SymmetricHeap::Create(a->backend(), group, std::move(*x), *opts);
  if (!heap.ok()) {
    Fail(heap.status());
    return nullptr;
  }
  return cma::capi::RegisterSymmetricHeap(std::move(*heap), group.local_devices, opts->signal_bytes);
}

}  // extern "C"
