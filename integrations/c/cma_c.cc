// The C ABI (cma_c.h) over one process-wide CachingManagedAllocator.
#include "backends/mutex_lock.h"
#include "integrations/c/cma_c.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/registry.h"
#include "integrations/c/cma_c_internal.h"
#include "nlohmann/json.hpp"

namespace cma {
namespace capi {

using cma::CachingManagedAllocator;

struct Global {
  absl::Mutex mu;
  std::unique_ptr<cma::Backend> backend ABSL_GUARDED_BY(mu);
  std::unique_ptr<CachingManagedAllocator> allocator ABSL_GUARDED_BY(mu);
  std::string config ABSL_GUARDED_BY(mu);
  std::string backend_request ABSL_GUARDED_BY(mu);
  // The last PyTorch settings given (validated), applied to every allocator
  // made from now on too: giving them before the first allocation does not
  // create the allocator (and the CUDA context) early.
  std::string pytorch_settings ABSL_GUARDED_BY(mu);
  // Read without the lock on the allocation path.
  std::atomic<CachingManagedAllocator*> current{nullptr};
};

Global& G() {
  static Global* g = new Global;  // never destroyed: outlives every caller
  return *g;
}

thread_local std::string last_error;
thread_local int last_error_code = 0;

int Fail(const absl::Status& s) {
  last_error = std::string(s.message());
  last_error_code = static_cast<int>(s.code());
  return -1;
}

cma::Stream AsStream(void* s) { return reinterpret_cast<cma::Stream>(s); }

const char* EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

absl::Status Init(const std::string& config, const std::string& backend) {
  Global& g = G();
  cma::MutexLock l(&g.mu);
  if (g.allocator) {
    if (config == g.config && backend == g.backend_request) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "cma_init: already initialised with config '", g.config, "' and backend '",
        g.backend_request, "'; call cma_shutdown first"));
  }
  absl::StatusOr<std::unique_ptr<cma::Backend>> b = cma::MakeBackend(backend);
  if (!b.ok()) return b.status();
  auto a = CachingManagedAllocator::Create(**b, config);
  if (!a.ok()) return a.status();
  if (!g.pytorch_settings.empty()) {
    if (absl::Status s = (*a)->ApplyPyTorchSettings(g.pytorch_settings); !s.ok()) return s;
  }
  g.backend = std::move(*b);
  g.allocator = std::move(*a);
  g.config = config;
  g.backend_request = backend;
  g.current.store(g.allocator.get(), std::memory_order_release);
  return absl::OkStatus();
}

// The allocator, created from the environment on first use.
CachingManagedAllocator* Get() {
  CachingManagedAllocator* a = G().current.load(std::memory_order_acquire);
  if (a != nullptr) return a;
  absl::Status s = Init(EnvOr("CMA_ALLOC_CONF", ""), EnvOr("CMA_BACKEND", "best"));
  if (!s.ok()) {
    Fail(s);
    return nullptr;
  }
  return G().current.load(std::memory_order_acquire);
}

std::string PyTorchSettings() {
  Global& g = G();
  cma::MutexLock l(&g.mu);
  return g.pytorch_settings;
}

char* CopyString(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

nlohmann::json StatsJson(const cma::DeviceStats& s) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : s.Flatten()) j[k] = v;
  return j;
}

}  // namespace capi
}  // namespace cma

using cma::CachingManagedAllocator;
using cma::capi::CopyString;
using cma::capi::Fail;
using cma::capi::Get;
using cma::capi::StatsJson;
using cma::capi::G;
using cma::capi::Init;
using cma::capi::last_error;
using cma::capi::last_error_code;
using cma::capi::AsStream;
using cma::capi::Global;

using cma::capi::WithAllocator;

extern "C" {

int cma_init(const char* config, const char* backend) {
  absl::Status s = Init(config ? config : "", backend ? backend : "best");
  return s.ok() ? 0 : Fail(s);
}

void cma_shutdown(void) {
  Global& g = G();
  cma::MutexLock l(&g.mu);
  g.current.store(nullptr, std::memory_order_release);
  g.allocator.reset();
  g.backend.reset();
  g.config.clear();
  g.backend_request.clear();
  g.pytorch_settings.clear();
}

const char* cma_backend_name(void) {
  CachingManagedAllocator* a = Get();
  return a ? a->backend().name() : nullptr;
}

int cma_device_count(void) {
  CachingManagedAllocator* a = Get();
  return a ? a->device_count() : -1;
}

const char* cma_last_error(void) { return last_error.c_str(); }
int cma_last_error_code(void) { return last_error_code; }

int cma_mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  if (device < 0 || device >= a->device_count()) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "cma_mem_info: invalid device %d (%d devices)", device, a->device_count())));
  }
  absl::StatusOr<cma::MemInfo> m = a->backend().GetMemInfo(device);
  if (!m.ok()) return Fail(m.status());
  if (free_bytes != nullptr) *free_bytes = m->free_bytes;
  if (total_bytes != nullptr) *total_bytes = m->total_bytes;
  return 0;
}

void* cma_malloc(size_t size, int device, void* stream) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return nullptr;
  absl::StatusOr<void*> p = a->Allocate(size, device, AsStream(stream));
  if (!p.ok()) {
    Fail(p.status());
    return nullptr;
  }
  cma::capi::RecordAlloc(*p, size, device, stream);
  return *p;
}

int cma_free(void* ptr) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::Status s = a->Free(ptr);
  if (!s.ok()) return Fail(s);
  cma::capi::RecordFree(ptr);
  return 0;
}

int cma_record_stream(void* ptr, void* stream) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.RecordStream(ptr, AsStream(stream)); });
}

int cma_move(void* ptr, int location, void* stream, int contents_dead) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  if (location < -1) return Fail(absl::InvalidArgumentError("cma_move: location must be >= -1"));
  const cma::Location target =
      location == -1 ? cma::Location::Host() : cma::Location::Device(location);
  absl::Status s = a->Move(ptr, target, AsStream(stream), contents_dead != 0);
  return s.ok() ? 0 : Fail(s);
}

namespace {

int SetAway(void* const* ptrs, int n, void* stream, bool away) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  const char* what = away ? "cma_send_away" : "cma_bring_back";
  if (n < 0 || (n > 0 && ptrs == nullptr)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(what, ": n < 0 or no pointers")));
  }
  const absl::Span<void* const> span(ptrs, static_cast<std::size_t>(n));
  absl::Status s = away ? a->SendAway(span, AsStream(stream)) : a->BringBack(span, AsStream(stream));
  return s.ok() ? 0 : Fail(s);
}

}  // namespace

int cma_send_away(void* const* ptrs, int n, void* stream) {
  return SetAway(ptrs, n, stream, /*away=*/true);
}

int cma_bring_back(void* const* ptrs, int n, void* stream) {
  return SetAway(ptrs, n, stream, /*away=*/false);
}

int cma_advise(void* ptr, int read_mostly, int preferred, const int* accessed_by,
               int n_accessed_by) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  if (preferred < -2 || n_accessed_by < 0 || (n_accessed_by > 0 && accessed_by == nullptr)) {
    return Fail(absl::InvalidArgumentError("cma_advise: bad preferred location or accessed_by"));
  }
  cma::AllocationHints h;
  h.read_mostly = read_mostly != 0;
  if (preferred == -1) h.preferred_location = cma::Location::Host();
  if (preferred >= 0) h.preferred_location = cma::Location::Device(preferred);
  h.accessed_by.assign(accessed_by, accessed_by + n_accessed_by);
  absl::Status s = a->SetHints(ptr, h);
  return s.ok() ? 0 : Fail(s);
}

int cma_set_disposable(void* ptr, int disposable) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.SetDisposable(ptr, disposable != 0); });
}

int cma_set_keep(void* ptr, int keep) {
  return WithAllocator([&](CachingManagedAllocator& a) { return a.SetKeep(ptr, keep != 0); });
}

long long cma_sleep(int device, void* stream) { return cma_sleep_level(device, stream, 1); }

long long cma_sleep_level(int device, void* stream, int level) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  if (level < 0 || level > 2) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "cma: sleep level %d (0: migrate, 1: offload, 2: discard)", level)));
  }
  absl::StatusOr<std::size_t> n =
      a->Sleep(device, AsStream(stream), static_cast<cma::SleepLevel>(level));
  return n.ok() ? static_cast<long long>(*n) : Fail(n.status());
}

long long cma_release_sleep_staging(int device) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::StatusOr<std::size_t> n = a->ReleaseSleepStaging(device);
  return n.ok() ? static_cast<long long>(*n) : Fail(n.status());
}

long long cma_wake(int device, void* stream) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::StatusOr<std::size_t> n = a->Wake(device, AsStream(stream));
  return n.ok() ? static_cast<long long>(*n) : Fail(n.status());
}

int cma_synchronize(void* stream) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.backend().SynchronizeStream(AsStream(stream)); });
}

int cma_empty_cache(void) {
  return WithAllocator([&](CachingManagedAllocator& a) { return a.EmptyCache(); });
}

int cma_forget_stream(void* stream) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.ForgetStream(AsStream(stream)); });
}

int cma_pool_create_or_incref(int device, unsigned long long id0, unsigned long long id1) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.CreateOrIncrefPool(device, {id0, id1}); });
}

int cma_pool_begin(int device, unsigned long long id0, unsigned long long id1,
                   cma_stream_filter_fn filter, void* ctx, void (*release_ctx)(void* ctx)) {
  return cma_pool_begin_flags(device, id0, id1, filter, ctx, release_ctx, 0);
}

int cma_pool_begin_flags(int device, unsigned long long id0, unsigned long long id1,
                         cma_stream_filter_fn filter, void* ctx, void (*release_ctx)(void* ctx),
                         unsigned flags) {
  // The caller's context lives as long as the filter that uses it.
  std::shared_ptr<void> owned(ctx, [release_ctx](void* c) {
    if (release_ctx != nullptr) release_ctx(c);
  });
  constexpr unsigned kKnown = CMA_POOL_REUSE_AFTER_JOIN | CMA_POOL_NOT_A_CAPTURE;
  if ((flags & ~kKnown) != 0) {
    return Fail(absl::InvalidArgumentError(
        absl::StrFormat("cma_pool_begin_flags: unknown flags %#x", flags & ~kKnown)));
  }
  cma::PoolContextOptions options;
  options.reuse_after_join = (flags & CMA_POOL_REUSE_AFTER_JOIN) != 0;
  options.not_a_capture = (flags & CMA_POOL_NOT_A_CAPTURE) != 0;
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  cma::StreamFilter f;
  if (filter != nullptr) {
    f = [filter, owned](cma::Stream s) {
      return filter(owned.get(), reinterpret_cast<void*>(s)) != 0;
    };
  } else if (release_ctx != nullptr) {
    // No filter, but the context must still live until the pool context
    // ends: the allocator drops its filter then, outside its locks.
    f = [owned](cma::Stream) { return true; };
  }
  absl::Status s = a->BeginAllocateToPool(device, {id0, id1}, std::move(f), options);
  return s.ok() ? 0 : Fail(s);
}

int cma_allocating_to_pool(int device) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  if (device < 0 || device >= a->device_count()) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "cma_allocating_to_pool: device %d does not exist (%d devices)", device, a->device_count())));
  }
  return a->AllocatingToPool(device) ? 1 : 0;
}

int cma_pool_end(int device, unsigned long long id0, unsigned long long id1) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.EndAllocateToPool(device, {id0, id1}); });
}

int cma_pool_release(int device, unsigned long long id0, unsigned long long id1) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.ReleasePool(device, {id0, id1}); });
}

int cma_pool_check_live(int device, unsigned long long id0, unsigned long long id1,
                        void* const* ptrs, size_t n) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::StatusOr<bool> same = a->CheckPoolLiveAllocations(
      device, {id0, id1}, absl::Span<void* const>(ptrs, ptrs == nullptr ? 0 : n));
  if (!same.ok()) return Fail(same.status());
  return *same ? 1 : 0;
}

int cma_reset_peak_stats(int device) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::Status s;
  for (int d = 0; d < a->device_count(); ++d) {
    if (device < 0 || d == device) s.Update(a->ResetPeakStats(d));
  }
  if (device < 0) a->ResetHostPeakStats();
  if (device >= a->device_count()) {
    s = absl::InvalidArgumentError(absl::StrCat("cma: no device ", device));
  }
  return s.ok() ? 0 : Fail(s);
}

long long cma_take_live_peak(int device) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::StatusOr<std::size_t> peak = a->TakeLivePeak(device);
  if (!peak.ok()) return Fail(peak.status());
  return static_cast<long long>(*peak);
}

int cma_reset_accumulated_stats(int device) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  if (device < -1 || device >= a->device_count()) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "cma_reset_accumulated_stats: invalid device %d (%d devices; -1 for all)", device,
        a->device_count())));
  }
  absl::Status s;
  for (int d = 0; d < a->device_count(); ++d) {
    if (device == -1 || d == device) s.Update(a->ResetAccumulatedStats(d));
  }
  return s.ok() ? 0 : Fail(s);
}

int cma_device_of(void* ptr) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -2;
  absl::StatusOr<int> d = a->DeviceOf(ptr);
  if (d.ok()) return *d;  // kHostDevice is -1
  Fail(d.status());
  return -2;
}

size_t cma_allocation_size(void* ptr) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return 0;
  absl::StatusOr<std::size_t> n = a->RequestedSize(ptr);
  if (!n.ok()) {
    Fail(n.status());
    return 0;
  }
  return *n;
}

int cma_set_memory_fraction(double fraction, int device) {
  return WithAllocator(
      [&](CachingManagedAllocator& a) { return a.SetMemoryFraction(fraction, device); });
}

int cma_apply_pytorch_settings(const char* settings) {
  if (settings == nullptr) {
    return Fail(absl::InvalidArgumentError("cma_apply_pytorch_settings: null settings string"));
  }
  Global& g = G();
  cma::MutexLock l(&g.mu);
  // Without an allocator, checked now: whether a shared key's value is
  // accepted does not depend on the allocator's own configuration.
  absl::Status s =
      g.allocator ? g.allocator->ApplyPyTorchSettings(settings)
                  : cma::ParsePyTorchSharedSettings(settings, cma::AllocatorConfig{}).status();
  if (!s.ok()) return Fail(s);
  g.pytorch_settings = settings;
  return 0;
}

int cma_set_host_routing(int device, int on) {
  return WithAllocator([&](CachingManagedAllocator& a) { return a.SetHostRouting(device, on != 0); });
}

int cma_mark_iteration(int device) {
  return WithAllocator([&](CachingManagedAllocator& a) { return a.MarkIteration(device); });
}

int cma_note_uses(int device, void* const* ptrs, int n, void* stream) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  if (n < 0 || (n > 0 && ptrs == nullptr)) {
    return Fail(absl::InvalidArgumentError("cma_note_uses: n < 0 or no pointers"));
  }
  absl::Status s =
      a->NoteUses(device, absl::Span<void* const>(ptrs, static_cast<std::size_t>(n)),
                  AsStream(stream));
  return s.ok() ? 0 : Fail(s);
}

int cma_placed_on_host(void* ptr) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return -1;
  absl::StatusOr<bool> on_host = a->PlacedOnHost(ptr);
  if (!on_host.ok()) {
    Fail(on_host.status());
    return -1;
  }
  return *on_host ? 1 : 0;
}

char* cma_stats_json(int device) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return nullptr;
  // Managed and symmetric memory side by side (cma_c_internal.h).
  if (device == -1) {
    nlohmann::json j = StatsJson(a->GetStats());
    cma::capi::AddSymmetricStats(-1, j);
    return CopyString(j.dump());
  }
  absl::StatusOr<cma::DeviceStats> s = a->GetStats(device);
  if (!s.ok()) {
    Fail(s.status());
    return nullptr;
  }
  nlohmann::json j = StatsJson(*s);
  cma::capi::AddSymmetricStats(device, j);
  return CopyString(j.dump());
}

char* cma_host_stats_json(void) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return nullptr;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : a->GetHostStats().Flatten()) j[k] = v;
  return CopyString(j.dump());
}

char* cma_last_placement_error(int device) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return nullptr;
  absl::StatusOr<std::string> s = a->LastPlacementError(device);
  if (!s.ok()) {
    Fail(s.status());
    return nullptr;
  }
  return CopyString(*s);
}

char* cma_symmetric_snapshot_json(void) {
  return CopyString(cma::capi::SymmetricSnapshotJson().dump());
}

char* cma_snapshot_json(void) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return nullptr;
  nlohmann::json out = nlohmann::json::array();
  for (const cma::SegmentSnapshot& seg : a->Snapshot()) {
    nlohmann::json blocks = nlohmann::json::array();
    for (const cma::BlockSnapshot& b : seg.blocks) {
      blocks.push_back({{"address", b.address},
                        {"size", b.size},
                        {"requested_size", b.requested},
                        {"state", b.state},
                        {"stream", b.stream},
                        {"location", b.location},
                        {"away", b.away},
                        {"pool", {b.pool.first, b.pool.second}}});
    }
    out.push_back({{"device", seg.device},
                   {"address", seg.address},
                   {"total_size", seg.total_size},
                   {"allocated_size", seg.allocated_size},
                   {"requested_size", seg.requested_size},
                   {"segment_type", seg.segment_type},
                   {"is_arena", seg.is_arena},
                   {"populated_bytes", seg.populated_bytes},
                   {"on_host", seg.on_host},
                   {"blocks", std::move(blocks)}});
  }
  return CopyString(out.dump());
}

char* cma_config_json(void) {
  CachingManagedAllocator* a = Get();
  if (a == nullptr) return nullptr;
  const cma::AllocatorConfig& c = a->config();
  // "config" is what the allocator was made with; "live" what it follows
  // now, PyTorch's settings of the shared keys applied since included, so
  // that a tool reporting the allocator's settings reports these.
  const cma::AllocatorConfig live = a->LiveConfig();
  nlohmann::json divisions = nlohmann::json::array();
  for (int i = 0; i < cma::RoundupDivisions::kIntervals; ++i) {
    divisions.push_back(live.roundup_power2_divisions.For(std::size_t{1} << (20 + i)));
  }
  nlohmann::json j = {
      {"config", c.ToString()},
      {"learn_step", c.learn_step},
      {"oversubscribe", c.oversubscribe},
      {"live",
       {{"config", live.ToString()},
        {"max_split_size", live.max_split_size},
        {"roundup_power2_divisions", live.roundup_power2_divisions.ToString()},
        {"roundup_power2_divisions_by_interval", std::move(divisions)},
        {"garbage_collection_threshold", live.garbage_collection_threshold},
        {"segments", live.segments == cma::SegmentMode::kArena ? "arena" : "classic"},
        {"pytorch_settings", cma::capi::PyTorchSettings()}}}};
  return CopyString(j.dump());
}

void cma_string_free(char* s) { std::free(s); }


}  // extern "C"
