// The C ABI of the symmetric heap (cma_c.h, second half), and its share of
// the unified statistics.
#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/multi_host.h"
#include "allocator/symmetric/wire.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/host/host_backend.h"
#include "backends/mutex_lock.h"
#include "integrations/c/cma_c.h"
#include "integrations/c/cma_c_internal.h"

struct cma_symmetric_heap {
  std::unique_ptr<cma::SymmetricHeap> heap;
  std::vector<int> local_devices;
  std::size_t signal_bytes = 0;
};

namespace cma {
namespace capi {
namespace {

// An allocation handed out through the C ABI, by its handle.
struct Held {
  cma_symmetric_heap* heap = nullptr;
  SymmetricHandle handle;
};

// A C handle is a number this process never hands out twice, not an
// address: a freed or stale one is looked up and refused, never read, even
// when the heap hands the same allocation out again (a cache hit) or builds
// a new one where an emptied one was.
struct Registry {
  absl::Mutex mu;
  std::set<cma_symmetric_heap*> heaps ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::uintptr_t, Held> live ABSL_GUARDED_BY(mu);
  std::uintptr_t next_handle ABSL_GUARDED_BY(mu) = 1;
};

Registry& Heaps() {
  static Registry* r = new Registry;  // never destroyed
  return *r;
}

absl::StatusOr<SymmetricOptions> ParseOptions(const char* text) {
  SymmetricOptions o;
  if (text == nullptr) return o;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits(':', 1));
    std::size_t n = 0;
    if (kv.first == "signal_bytes" && absl::SimpleAtoi(kv.second, &n) && n <= (1u << 20)) {
      o.signal_bytes = n;
    } else if (kv.first == "multicast" && (kv.second == "0" || kv.second == "1")) {
      o.multicast = kv.second == "1";
    } else if (kv.first == "non_dumpable" && (kv.second == "0" || kv.second == "1")) {
      o.non_dumpable = kv.second == "1";
    } else if (kv.first == "provider" && (kv.second == "vmm" || kv.second == "nvshmem")) {
      o.provider = kv.second == "vmm" ? SymmetricProvider::kVmm : SymmetricProvider::kNvshmem;
    } else if (kv.first == "handles" &&
               (kv.second == "fd" || kv.second == "fabric" || kv.second == "fabric_or_fd")) {
      o.handle_type = kv.second == "fd" ? HandleType::kPosixFd : HandleType::kFabric;
      o.fabric_fallback = kv.second == "fabric_or_fd";
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "cma_symmetric_create: bad option '", item,
          "'; accepted: signal_bytes:N (up to 1M), multicast:0|1, non_dumpable:0|1, "
          "handles:fd|fabric|fabric_or_fd, provider:vmm|nvshmem"));
    }
  }
  return o;
}

}  // namespace

void AddSymmetricStats(int device, nlohmann::json& stats) {
  std::int64_t bytes = 0, peak = 0, cached = 0, allocs = 0, hits = 0, exchanges = 0;
  Registry& r = Heaps();
  MutexLock l(&r.mu);
  for (cma_symmetric_heap* h : r.heaps) {
    const auto n = static_cast<std::int64_t>(
        device < 0 ? h->local_devices.size()
                   : std::count(h->local_devices.begin(), h->local_devices.end(), device));
    if (n == 0) continue;
    const SymmetricStats s = h->heap->GetStats();
    const auto members = static_cast<std::int64_t>(h->local_devices.size());
    bytes += s.symmetric_bytes * n / members;
    peak += s.symmetric_bytes_peak * n / members;
    cached += s.cached_bytes * n / members;
    allocs += s.allocations;
    hits += s.cache_hits;
    exchanges += s.exchanges;
  }
  stats["symmetric_bytes.current"] = bytes;
  stats["symmetric_bytes.peak"] = peak;
  stats["symmetric_cached_bytes"] = cached;
  stats["symmetric_allocations"] = allocs;
  stats["symmetric_cache_hits"] = hits;
  stats["symmetric_exchanges"] = exchanges;
}

nlohmann::json SymmetricSnapshotJson() {
  nlohmann::json out = nlohmann::json::array();
  Registry& r = Heaps();
  MutexLock l(&r.mu);
  for (cma_symmetric_heap* h : r.heaps) {
    for (const SymmetricSnapshot& a : h->heap->Snapshot()) {
      nlohmann::json peers = nlohmann::json::array();
      for (void* p : a.peers) peers.push_back(reinterpret_cast<std::uintptr_t>(p));
      out.push_back({{"id", a.id},
                     {"bytes", a.bytes},
                     {"stride", a.stride},
                     {"state", a.cached ? "cached" : "allocated"},
                     {"local_devices", h->local_devices},
                     {"peers", std::move(peers)}});
    }
  }
  return out;
}

absl::StatusOr<SymmetricOptions> ParseSymmetricOptions(const char* text) {
  return ParseOptions(text);
}

// The checks every create makes; OK or why not.
absl::Status CheckSymmetricCreate(const char* who, int world_size, const int* local_ranks,
                                  const int* local_devices, int n_local, double timeout_seconds) {
  if (world_size < 1 || n_local < 1 || n_local > world_size || local_ranks == nullptr ||
      local_devices == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": needs world_size >= 1 and 1..world_size local members with their ranks and "
             "devices"));
  }
  std::set<int> seen;
  for (int i = 0; i < n_local; ++i) {
    if (local_ranks[i] < 0 || local_ranks[i] >= world_size ||
        !seen.insert(local_ranks[i]).second) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: local rank %d is out of range or repeated (world size %d)", who, local_ranks[i],
          world_size));
    }
    if (local_devices[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: local device %d of rank %d is negative", who, local_devices[i],
                          local_ranks[i]));
    }
  }
  // Checked here as a double, before any conversion (NaN compares false;
  // absl::Seconds of a huge double saturates to infinity), and for every
  // kind of heap, so that one timeout means the same everywhere.
  const double max_seconds = absl::ToDoubleSeconds(kMaxExchangeTimeout);
  if (!(timeout_seconds > 0) || !(timeout_seconds <= max_seconds)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the timeout must be positive and at most 24h (%g s; got %g s): "
        "every wait is bounded, so that a dead member is reported, never waited for",
        who, max_seconds, timeout_seconds));
  }
  return absl::OkStatus();
}

cma_symmetric_heap* RegisterSymmetricHeap(std::unique_ptr<SymmetricHeap> heap,
                                          std::vector<int> local_devices,
                                          std::size_t signal_bytes) {
  auto* h = new cma_symmetric_heap{std::move(heap), std::move(local_devices), signal_bytes};
  Registry& r = Heaps();
  MutexLock l(&r.mu);
  r.heaps.insert(h);
  return h;
}

// The members this process serves, from the C arguments (already checked).
SymmetricGroup SymmetricGroupOf(int world_size, const int* local_ranks, const int* local_devices,
                                int n_local) {
  SymmetricGroup g;
  g.world_size = world_size;
  g.local_ranks.assign(local_ranks, local_ranks + n_local);
  g.local_devices.assign(local_devices, local_devices + n_local);
  return g;
}

}  // namespace capi
}  // namespace cma

namespace {

using cma::capi::Fail;

// Every process's verdict on its own arguments, gathered before anything
// else (fixed size): ok, or the start of its reason (printable ASCII only:
// the bytes come through the framework's all-gather, which is not trusted).
struct Verdict {
  char ok;
  char reason[255];
};

Verdict ToVerdict(const absl::Status& s) {
  Verdict v{};
  v.ok = s.ok() ? 1 : 0;
  const std::string why(s.message().substr(0, sizeof(v.reason) - 1));
  std::memcpy(v.reason, why.data(), why.size());
  return v;
}

// With `allgather`, every process's verdict: OK when all passed; otherwise
// this process's own error, or one naming the first process that refused
// (with its reason), so that every process fails together, before any
// rendezvous, rather than the others waiting in the framework's all-gather
// or in a heap whose first collective times out.
absl::Status AgreeOnArguments(const char* who, const absl::Status& mine, int process_count,
                              cma_allgather_fn allgather, void* ctx) {
  const Verdict v = ToVerdict(mine);
  std::vector<Verdict> all(static_cast<std::size_t>(process_count));
  if (allgather(ctx, &v, sizeof(v), all.data()) != 0) {
    return mine.ok() ? absl::UnavailableError(absl::StrCat(who, ": the allgather callback failed"))
                     : mine;
  }
  if (!mine.ok()) return mine;
  for (int p = 0; p < process_count; ++p) {
    const Verdict& their = all[static_cast<std::size_t>(p)];
    if (their.ok == 1) continue;
    std::string why(their.reason, strnlen(their.reason, sizeof(their.reason)));
    for (char& c : why) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: process %d refused its own arguments (%s), so no process makes the heap", who, p,
        why));
  }
  return absl::OkStatus();
}

// The live allocation behind a C handle, or null (an error set, naming
// `who`) for a null, freed or unknown one.
const cma::SymmetricAllocation* Find(const cma_symmetric_allocation* a, const char* who) {
  cma::capi::Registry& r = cma::capi::Heaps();
  cma::MutexLock l(&r.mu);
  auto it = r.live.find(reinterpret_cast<std::uintptr_t>(a));
  if (it == r.live.end()) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        who, ": not a live symmetric allocation (null, freed already, or of a destroyed heap)")));
    return nullptr;
  }
  return it->second.handle.allocation;
}

}  // namespace

extern "C" {

cma_symmetric_heap* cma_symmetric_create(int world_size, const int* local_ranks,
                                         const int* local_devices, int n_local,
                                         int process_index, int process_count,
                                         cma_allgather_fn allgather, void* ctx,
                                         double timeout_seconds, const char* options) {
  constexpr const char* kWho = "cma_symmetric_create";
  cma::CachingManagedAllocator* a = cma::capi::Get();
  if (a == nullptr) return nullptr;
  absl::Status mine = cma::capi::CheckSymmetricCreate(kWho, world_size, local_ranks, local_devices, n_local,
                                  timeout_seconds);
  absl::StatusOr<cma::SymmetricOptions> opts = cma::capi::ParseOptions(options);
  if (mine.ok() && !opts.ok()) mine = opts.status();
  // With other processes, each one's verdict on its own arguments is
  // gathered first (one more use of the callback), so that bad input on
  // one process fails every process at once, naming it. Without a usable
  // all-gather (none, or a bad index or count) there is no one to tell.
  if (allgather != nullptr && process_count > 1 && process_index >= 0 &&
      process_index < process_count) {
    mine = AgreeOnArguments(kWho, mine, process_count, allgather, ctx);
  }
  if (!mine.ok()) {
    Fail(mine);
    return nullptr;
  }
  const cma::SymmetricGroup g = cma::capi::SymmetricGroupOf(world_size, local_ranks, local_devices, n_local);
  const absl::Duration timeout = absl::Seconds(timeout_seconds);
  absl::StatusOr<std::unique_ptr<cma::Exchange>> x;
  if (allgather == nullptr) {
    if (n_local != world_size || process_count != 1) {
      Fail(absl::InvalidArgumentError(
          "cma_symmetric_create: members in other processes need an allgather callback"));
      return nullptr;
    }
    x = cma::MakeSingleProcessExchange();
  } else {
    x = cma::MakeCallbackExchange(allgather, ctx, process_index, process_count, timeout);
  }
  if (!x.ok()) {
    Fail(x.status());
    return nullptr;
  }
  auto heap = cma::SymmetricHeap::Create(a->backend(), g, std::move(*x), *opts);
  if (!heap.ok()) {
    Fail(heap.status());
    return nullptr;
  }
  return cma::capi::RegisterSymmetricHeap(std::move(*heap), g.local_devices, opts->signal_bytes);
}

void cma_symmetric_destroy(cma_symmetric_heap* heap) {
  if (heap == nullptr) return;
  {
    cma::capi::Registry& r = cma::capi::Heaps();
    cma::MutexLock l(&r.mu);
    r.heaps.erase(heap);
    absl::erase_if(r.live, [&](const auto& kv) { return kv.second.heap == heap; });
  }
  delete heap;
}

cma_symmetric_allocation* cma_symmetric_alloc(cma_symmetric_heap* heap, size_t size,
                                              int make_symmetric) {
  if (heap == nullptr) {
    Fail(absl::InvalidArgumentError("cma_symmetric_alloc: null heap"));
    return nullptr;
  }
  auto a = heap->heap->Allocate(size, make_symmetric != 0);
  if (!a.ok()) {
    Fail(a.status());
    return nullptr;
  }
  cma::capi::Registry& r = cma::capi::Heaps();
  cma::MutexLock l(&r.mu);
  const std::uintptr_t id = r.next_handle++;
  r.live[id] = {heap, *a};
  return reinterpret_cast<cma_symmetric_allocation*>(id);
}

int cma_symmetric_free(cma_symmetric_heap* heap, cma_symmetric_allocation* a) {
  if (heap == nullptr) return Fail(absl::InvalidArgumentError("cma_symmetric_free: null heap"));
  cma::SymmetricHandle handle;
  {
    cma::capi::Registry& r = cma::capi::Heaps();
    cma::MutexLock l(&r.mu);
    auto it = r.live.find(reinterpret_cast<std::uintptr_t>(a));
    if (it == r.live.end() || it->second.heap != heap) {
      return Fail(absl::InvalidArgumentError(
          it == r.live.end()
              ? "cma_symmetric_free: not a live symmetric allocation (freed already: a stale "
                "handle, or one this process never handed out)"
              : "cma_symmetric_free: the allocation belongs to another heap"));
    }
    handle = it->second.handle;
  }
  // The registry entry goes only once the heap took the allocation back, so
  // that a refused free leaves the handle usable.
  absl::Status s = heap->heap->Free(handle);
  if (!s.ok()) return Fail(s);
  cma::capi::Registry& r = cma::capi::Heaps();
  cma::MutexLock l(&r.mu);
  r.live.erase(reinterpret_cast<std::uintptr_t>(a));
  return 0;
}

int cma_symmetric_empty_cache(cma_symmetric_heap* heap) {
  if (heap == nullptr) {
    return Fail(absl::InvalidArgumentError("cma_symmetric_empty_cache: null heap"));
  }
  absl::Status s = heap->heap->EmptyCache();
  return s.ok() ? 0 : Fail(s);
}

size_t cma_symmetric_size(const cma_symmetric_allocation* a) {
  const cma::SymmetricAllocation* s = Find(a, "cma_symmetric_size");
  return s == nullptr ? 0 : s->bytes;
}

void* cma_symmetric_peer(const cma_symmetric_allocation* a, int rank) {
  const cma::SymmetricAllocation* s = Find(a, "cma_symmetric_peer");
  if (s == nullptr) return nullptr;
  if (rank < 0 || rank >= static_cast<int>(s->peers.size())) {
    Fail(absl::InvalidArgumentError(absl::StrCat("cma_symmetric_peer: no member ", rank)));
    return nullptr;
  }
  return s->peers[rank];
}

void* cma_symmetric_signal(const cma_symmetric_allocation* a, int rank) {
  const cma::SymmetricAllocation* s = Find(a, "cma_symmetric_signal");
  if (s == nullptr) return nullptr;
  if (rank < 0 || rank >= static_cast<int>(s->signals.size())) {
    Fail(absl::InvalidArgumentError(absl::StrCat("cma_symmetric_signal: no member ", rank)));
    return nullptr;
  }
  return s->signals[rank];
}

char* cma_symmetric_unreachable_json(const cma_symmetric_allocation* a) {
  const cma::SymmetricAllocation* s = Find(a, "cma_symmetric_unreachable_json");
  if (s == nullptr) return nullptr;
  nlohmann::json ranks = nlohmann::json::array();
  for (std::size_t r = 0; r < s->peers.size(); ++r) {
    if (s->peers[r] == nullptr) ranks.push_back(r);
  }
  nlohmann::json j = {{"ranks", std::move(ranks)}, {"reason", s->unreachable}};
  return cma::capi::CopyString(j.dump());
}

}  // extern "C"

namespace {

int Transfer(bool put, const cma_symmetric_allocation* a, int rank, size_t offset, void* local,
             size_t bytes, void* stream) {
  const char* who = put ? "cma_symmetric_put" : "cma_symmetric_get";
  cma::capi::Registry& r = cma::capi::Heaps();
  // Held across the copy, so that neither the heap nor the handle goes
  // meanwhile (cma_symmetric_destroy takes it first); the heap's own lock
  // is taken after it, never before, anywhere.
  cma::MutexLock l(&r.mu);
  auto it = r.live.find(reinterpret_cast<std::uintptr_t>(a));
  if (it == r.live.end()) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        who, ": not a live symmetric allocation (null, freed already, or of a destroyed heap)")));
  }
  const cma::Stream s = reinterpret_cast<cma::Stream>(stream);
  absl::Status st = put ? it->second.heap->heap->Put(it->second.handle, rank, offset, local, bytes, s)
                        : it->second.heap->heap->Get(it->second.handle, rank, offset, local, bytes, s);
  return st.ok() ? 0 : Fail(st);
}

}  // namespace

extern "C" {

int cma_symmetric_put(const cma_symmetric_allocation* a, int rank, size_t offset,
                      const void* src, size_t bytes, void* stream) {
  return Transfer(true, a, rank, offset, const_cast<void*>(src), bytes, stream);
}

int cma_symmetric_get(const cma_symmetric_allocation* a, int rank, size_t offset, void* dst,
                      size_t bytes, void* stream) {
  return Transfer(false, a, rank, offset, dst, bytes, stream);
}

size_t cma_symmetric_signal_size(const cma_symmetric_heap* heap) {
  return heap == nullptr ? 0 : heap->signal_bytes;
}

void* cma_symmetric_device_peers(const cma_symmetric_allocation* a) {
  const cma::SymmetricAllocation* s = Find(a, "cma_symmetric_device_peers");
  return s == nullptr ? nullptr : s->device_peers;
}

char* cma_symmetric_stats_json(cma_symmetric_heap* heap) {
  if (heap == nullptr) {
    Fail(absl::InvalidArgumentError("cma_symmetric_stats_json: null heap"));
    return nullptr;
  }
  const cma::SymmetricStats s = heap->heap->GetStats();
  nlohmann::json j = {{"allocations", s.allocations},
                      {"cache_hits", s.cache_hits},
                      {"exchanges", s.exchanges},
                      {"symmetric_bytes", s.symmetric_bytes},
                      {"symmetric_bytes_peak", s.symmetric_bytes_peak},
                      {"cached_bytes", s.cached_bytes},
                      {"windows", s.windows}};
  return cma::capi::CopyString(j.dump());
}

int cma_symmetric_register_nccl_window(cma_symmetric_heap* heap,
                                       const cma_symmetric_allocation* a, void* nccl_comm,
                                       void** window) {
  // Only a null heap returns before the collective: everything else a
  // member gets wrong still joins it, so the others fail with it.
  if (heap == nullptr) {
    return Fail(absl::InvalidArgumentError("cma_symmetric_register_nccl_window: null heap"));
  }
  if (window != nullptr) *window = nullptr;
  // A handle this process does not know still goes to the heap, as an
  // empty one: the heap refuses it inside the collective, so the other
  // members fail with this one instead of waiting out their timeout.
  cma::SymmetricHandle handle;
  {
    cma::capi::Registry& r = cma::capi::Heaps();
    cma::MutexLock l(&r.mu);
    auto it = r.live.find(reinterpret_cast<std::uintptr_t>(a));
    if (it != r.live.end() && it->second.heap == heap) handle = it->second.handle;
  }
  absl::StatusOr<cma::CommWindow> w =
      heap->heap->RegisterWindow(handle, reinterpret_cast<cma::CommHandle>(nccl_comm));
  if (!w.ok()) return Fail(w.status());
  if (window != nullptr) *window = reinterpret_cast<void*>(*w);
  return 0;
}

void* cma_host_emulated_comm(int rank, int size, int device) {
  cma::CachingManagedAllocator* alloc = cma::capi::Get();
  if (alloc == nullptr) return nullptr;
  auto* host = dynamic_cast<cma::HostBackend*>(&alloc->backend());
  if (host == nullptr || rank < 0 || size < 1 || rank >= size) {
    Fail(absl::InvalidArgumentError(absl::StrCat(
        "cma_host_emulated_comm: ",
        host == nullptr ? absl::StrCat("the ", alloc->backend().name(),
                                       " backend has real communicators (NCCL's)")
                        : "needs 0 <= rank < size")));
    return nullptr;
  }
  return reinterpret_cast<void*>(host->MakeEmulatedComm(rank, size, device));
}

int cma_symmetric_release_nccl_windows(cma_symmetric_heap* heap, void* nccl_comm) {
  if (heap == nullptr) {
    return Fail(absl::InvalidArgumentError("cma_symmetric_release_nccl_windows: null heap"));
  }
  absl::StatusOr<int> n =
      heap->heap->ReleaseWindows(reinterpret_cast<cma::CommHandle>(nccl_comm));
  return n.ok() ? *n : Fail(n.status());
}

}  // extern "C"
