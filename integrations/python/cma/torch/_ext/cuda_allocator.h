// caching_managed_allocator as PyTorch's CUDA allocator: a subclass of
// c10::cuda::CUDACachingAllocator::CUDAAllocator, installed in place of
// PyTorch's own before CUDA initialises. cma/torch/_ext/build.py compiles
// cuda_allocator.cc (allocation, pools, install) and
// history.cc (history, snapshots, out-of-memory errors)
// against the installed torch on first use and calls install().
//
// Every virtual of the interface is served by cma through its C ABI
// (cma_c.h, resolved from the libcma.so that cma._lib loaded) or raises an
// error naming cma and the method. A MemPool given another allocator
// (MemPool(allocator=...)) is one of cma's pools whose segments come from
// that allocator (cma_pool_create_with_source). PyTorch's own Python functions
// (torch.cuda.memory_stats, _snapshot, _record_memory_history, MemPool,
// torch.cuda.graph, caching_allocator_alloc, OOM observers) then reach cma
// unpatched.
//
// Thread safety: every method may be called from any thread. The allocation
// and free paths take no lock of this file unless history recording, a trace
// tracker or the memory profiler is on.
//
// Formatting: numbers are formatted with snprintf and only strings reach
// c10's message builders (formatting a number through an iostream in this
// process mix crashed before, it seems from two C++ runtimes' locales).
#ifndef CMA_TORCH_ALLOCATOR_H_
#define CMA_TORCH_ALLOCATOR_H_

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cma_c.h"
#include "capture_watch.h"

namespace cma_torch {
namespace internal {


namespace cca = c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::RecordContext;
using c10::CachingDeviceAllocator::TraceEntry;
using Pool = c10::MempoolId_t;

// absl::StatusCode numbers, as cma_last_error_code() reports them.
constexpr int kFailedPrecondition = 9;
constexpr int kResourceExhausted = 8;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// cma's C ABI: the one table of it in the extension, filled by LoadApi()
// (the CUDA allocator's install() and the CPU allocator's cpu_on() both).
struct Api {
  void* (*malloc)(size_t, int, void*);
  int (*free)(void*);
  int (*record_stream)(void*, void*);
  size_t (*allocation_size)(void*);
  int (*empty_cache)();
  const char* (*last_error)();
  int (*last_error_code)();
  int (*mem_info)(int, size_t*, size_t*);
  int (*set_memory_fraction)(double, int);
  int (*reset_peak_stats)(int);
  int (*reset_accumulated_stats)(int);
  long long (*stats_pairs)(int, cma_stat_pair*, size_t);
  int (*snapshot_visit)(void (*)(void*, const cma_segment_info*),
                        void (*)(void*, const cma_block_info*), void*);
  int (*pool_create_or_incref)(int, unsigned long long, unsigned long long);
  int (*pool_create_with_source)(int, unsigned long long, unsigned long long,
                                 const cma_segment_source*);
  int (*pool_begin_flags)(int, unsigned long long, unsigned long long, cma_stream_filter_fn,
                          void*, void (*)(void*), unsigned);
  int (*pool_end)(int, unsigned long long, unsigned long long);
  int (*pool_release)(int, unsigned long long, unsigned long long);
  int (*pool_use_count)(int, unsigned long long, unsigned long long);
  int (*pool_set_options)(int, unsigned long long, unsigned long long, int, int);
  int (*pool_empty_cache)(int, unsigned long long, unsigned long long);
  int (*pool_check_live)(int, unsigned long long, unsigned long long, void* const*, size_t);
  int (*live_settings)(cma_live_settings_info*);
  cma_pool_checkpoint* (*pool_checkpoint_take)(int, unsigned long long, unsigned long long);
  void (*pool_checkpoint_free)(cma_pool_checkpoint*);
  int (*pool_checkpoint_restore)(const cma_pool_checkpoint*, cma_pool_ptr_fn, cma_pool_ptr_fn,
                                 void*);
};
extern Api api;  // cuda_allocator.cc
// Opens `library` (the libcma.so that cma._lib loaded) and resolves `api`
// from it, once: later calls do nothing. On a missing symbol it raises and
// leaves `api` as it was. Called under the GIL.
void LoadApi(const std::string& library);

std::string LastError();
// Raises RuntimeError naming cma, the method and cma's reason.
[[noreturn]] void Fail(const char* method);
[[noreturn]] void Unsupported(const char* method, const char* why);

// cma's statistics by key ("allocated_bytes.all.current", ...).
using StatMap = std::unordered_map<std::string, int64_t>;
StatMap Stats(int device);
int64_t Get(const StatMap& m, const std::string& key);
void FillStatArray(const StatMap& m, const std::string& name, c10::CachingAllocator::StatArray& a);
// The settings cma follows now (cma_live_settings: CMA_ALLOC_CONF's, with
// PyTorch's settings of the keys both share as last applied); raises naming
// `method` if cma cannot say.
cma_live_settings_info LiveSettings(const char* method);

// One live allocation, remembered only while history, a tracker or the
// memory profiler wants it.
struct Live {
  size_t size;
  c10::DeviceIndex device;
  cudaStream_t stream;
  std::shared_ptr<c10::GatheredContext> context;
};

void Delete(void* ptr);

class CmaCudaAllocator final : public cca::CUDAAllocator {
 public:
  // ---- allocation ----
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
    void* p = Allocate(nbytes, device, stream, "allocate");
    return {p, p, &Delete, c10::Device(c10::DeviceType::CUDA, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Delete; }

  void* raw_alloc(size_t nbytes) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return Allocate(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream(),
                    "raw_alloc");
  }

  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    return Allocate(nbytes, device, stream, "raw_alloc_with_stream");
  }

  void raw_delete(void* ptr) override {
    if (ptr == nullptr) return;
    if (C10_UNLIKELY(FreeIfUncached(ptr))) return;
    if (Tracking()) RecordFree(ptr);
    if (api.free(ptr) != 0) Fail("raw_delete");
  }

  // The deleter of every DataPtr: it runs in destructors, so it warns
  // rather than throws (a pointer cma does not own never gets here unless
  // memory was corrupted).
  void DeleteFromDataPtr(void* ptr) {
    if (ptr == nullptr) return;
    if (C10_UNLIKELY(FreeIfUncached(ptr))) return;
    if (Tracking()) RecordFree(ptr);
    if (api.free(ptr) != 0) {
      TORCH_WARN("caching_managed_allocator: freeing a tensor's memory failed: ", LastError());
    }
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDefault));
  }

  // ---- lifecycle and configuration ----
  void init(int device_count) override {
    device_count_ = device_count;
    initialized_.store(true);
  }
  bool initialized() override { return initialized_.load(); }
  // enable(false) (torch.cuda.caching_allocator_enable) turns the uncached
  // mode on, as PYTORCH_NO_CUDA_MEMORY_CACHING does at start: see
  // AllocateUncached.
  void enable(bool value) override { enabled_.store(value); }
  bool isEnabled() const override { return enabled_.load(); }
  std::string name() override { return "caching_managed_allocator"; }

  // PyTorch's fraction as the user set it (1.0 until then). It covers every
  // pool, MemPools' own allocators' segments included: cma counts them in
  // its reserved bytes.
  double getMemoryFraction(c10::DeviceIndex device) override {
    double f = 1.0;
    return Fraction(device, &f) ? f : 1.0;
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> l(fraction_mu_);  // the setting and its record together
    if (api.set_memory_fraction(fraction, device) != 0) Fail("setMemoryFraction");
    fractions_[device] = fraction;
  }

  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override {
    return {};  // cma's arenas are its own; PyTorch's expandable segments are not used
  }

  // ---- cache and streams ----
  void emptyCache(Pool pool) override {
    if (C10_UNLIKELY(captures_.Any())) EndFailedCaptures();
    const bool whole = pool.first == 0 && pool.second == 0;
    const auto empty = [this, whole, pool] { whole ? EmptyAll() : EmptyPool(pool); };
    if (C10_UNLIKELY(history_on_.load(std::memory_order_relaxed))) {
      EmptyCacheTraced(empty);
    } else {
      empty();
    }
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest_block) override {
    size_t free_bytes = 0, total = 0;
    if (api.mem_info(device, &free_bytes, &total) != 0) Fail("cacheInfo");
    struct Ctx {
      int device;
      bool in_device = false;
      size_t largest;
    } ctx{device, false, free_bytes};
    auto on_segment = [](void* c, const cma_segment_info* s) {
      auto* x = static_cast<Ctx*>(c);
      x->in_device = s->device == x->device;
    };
    auto on_block = [](void* c, const cma_block_info* b) {
      auto* x = static_cast<Ctx*>(c);
      if (x->in_device && !b->active && b->size > x->largest) x->largest = b->size;
    };
    if (api.snapshot_visit(on_segment, on_block, &ctx) != 0) Fail("cacheInfo");
    *largest_block = ctx.largest;
  }

  void* getBaseAllocation(void*, size_t*) override {
    Unsupported("getBaseAllocation (CUDA IPC)", kNoIpc);
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr || IsUncached(ptr.get())) return;  // its free waits for the device
    // Another deleter: foreign memory, not cma's to track; or an alias that
    // cma.torch's zero-copy .to() made of a whole cma allocation (a CPU
    // tensor moved to the GPU), whose streams cma must know before reuse.
    if (ptr.get_deleter() != &Delete && api.allocation_size(ptr.get()) == 0) return;
    if (api.record_stream(ptr.get(), stream.stream()) != 0) Fail("recordStream");
  }

  // ---- statistics ----
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const StatMap m = Stats(device);
    DeviceStats s;
    FillStatArray(m, "allocation", s.allocation);
    FillStatArray(m, "segment", s.segment);
    FillStatArray(m, "active", s.active);
    FillStatArray(m, "inactive_split", s.inactive_split);
    FillStatArray(m, "allocated_bytes", s.allocated_bytes);
    FillStatArray(m, "reserved_bytes", s.reserved_bytes);
    FillStatArray(m, "active_bytes", s.active_bytes);
    FillStatArray(m, "inactive_split_bytes", s.inactive_split_bytes);
    FillStatArray(m, "requested_bytes", s.requested_bytes);
    s.num_alloc_retries = Get(m, "num_alloc_retries");
    s.num_ooms = Get(m, "num_ooms");
    s.num_sync_all_streams = Get(m, "num_sync_all_streams");
    s.num_device_alloc = Get(m, "num_device_alloc");
    s.num_device_free = Get(m, "num_device_free");
    // cma's live max_split_size (PYTORCH_CUDA_ALLOC_CONF's or
    // _set_allocator_settings' when they set it); unlimited (SIZE_MAX) is
    // -1, as PyTorch's own allocator reports it.
    const size_t max_split = LiveSettings("getDeviceStats").max_split_size;
    s.max_split_size = max_split == SIZE_MAX ? -1 : static_cast<int64_t>(max_split);
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (api.reset_accumulated_stats(device) != 0) Fail("resetAccumulatedStats");
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    if (api.reset_peak_stats(device) != 0) Fail("resetPeakStats");
  }

  // ---- private pools: MemPool and CUDA graphs (cuda_allocator.cc) ----
  // All of them live in cma's core, a MemPool given another allocator too
  // (its segments come from that allocator).
  void createOrIncrefPool(c10::DeviceIndex device, Pool pool,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override;
  void beginAllocateToPool(c10::DeviceIndex device, Pool pool,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, Pool pool) override;
  // Ends, and gives back the reference of, the contexts of this thread's
  // captures that failed without ending them (capture_watch.h).
  void EndFailedCaptures();
  void EndContext(c10::DeviceIndex device, Pool pool);
  void releasePool(c10::DeviceIndex device, Pool pool) override;
  int getPoolUseCount(c10::DeviceIndex device, Pool pool) override;
  void setUseOnOOM(c10::DeviceIndex device, Pool pool, bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, Pool pool) override;
  bool checkPoolLiveAllocations(c10::DeviceIndex device, Pool pool,
                                const std::unordered_set<void*>& expected) override;

  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device,
                                                          Pool pool) override {
    cma_pool_checkpoint* cp = api.pool_checkpoint_take(device, pool.first, pool.second);
    if (cp == nullptr) Fail("getCheckpointState");
    return std::make_shared<Checkpoint>(cp);
  }
  cca::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<cca::AllocatorState> state) override {
    auto* cp = dynamic_cast<Checkpoint*>(state.get());
    TORCH_CHECK(cp != nullptr, "caching_managed_allocator: setCheckpointPoolState was given a "
                               "state that cma's getCheckpointState did not make");
    struct Delta {
      std::vector<void*> freed;
      std::vector<std::pair<void*, size_t>> created;
    } delta;
    auto on_freed = [](void* c, void* p, size_t) { static_cast<Delta*>(c)->freed.push_back(p); };
    auto on_created = [](void* c, void* p, size_t n) {
      static_cast<Delta*>(c)->created.emplace_back(p, n);
    };
    if (api.pool_checkpoint_restore(cp->cp, on_freed, on_created, &delta) != 0) {
      Fail("setCheckpointPoolState");
    }
    cca::CheckpointDelta out;
    for (void* p : delta.freed) {
      if (Tracking()) RecordFree(p);
      out.ptrs_freed.push_back(p);
    }
    for (const auto& [p, n] : delta.created) {
      if (Tracking()) RecordAlloc(p, n, device, nullptr);
      out.dataptrs_allocd.emplace_back(p, p, &Delete, c10::Device(c10::DeviceType::CUDA, device));
    }
    return out;
  }

  // ---- IPC: managed memory has no cudaIpc handles ----
  cca::ShareableHandle shareIpcHandle(void*) override { Unsupported("shareIpcHandle", kNoIpc); }
  std::shared_ptr<void> getIpcDevPtr(std::string) override {
    Unsupported("getIpcDevPtr", kNoIpcOpen);
  }

  // ---- peers and copies ----
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    c10::cuda::CUDAGuard guard(dev);
    cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();  // clear the sticky-free error
      return;
    }
    C10_CUDA_CHECK(err);
  }
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                          size_t count, cudaStream_t stream, bool p2p_enabled) override {
    // Managed memory copies between any devices; another allocator's memory
    // may be among dst/src, so PyTorch's own rule is kept for it.
    if (p2p_enabled || dst_device == src_device) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  // ---- history, snapshots and observers ----
  void recordHistory(bool enabled, cca::CreateContextFn recorder, size_t max_entries,
                     RecordContext when, bool clear_history,
                     const std::vector<std::string>& skip_actions) override {
    // An unknown action name throws here, before anything changed.
    std::unordered_set<int> skip;
    for (const std::string& a : skip_actions) {
      skip.insert(c10::CachingDeviceAllocator::parseTraceEntryAction(a));
    }
    std::lock_guard<std::mutex> l(mu_);
    recorder_ = enabled ? recorder : nullptr;
    when_ = enabled ? when : RecordContext::NEVER;
    max_entries_ = std::max<size_t>(max_entries, 1);
    skip_ = std::move(skip);
    if (clear_history || !enabled) {
      traces_.clear();
      annotations_.clear();
    }
    history_on_.store(enabled);
    if (!enabled && trackers_.empty()) {
      live_.clear();
      freed_.clear();
    }
  }
  bool isHistoryEnabled() override { return history_on_.load(); }

  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    if (!history_on_.load()) return;
    c10::DeviceIndex device = 0;
    C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
    c10::CachingDeviceAllocator::AnnotationEntry ae(device, c10::getApproximateTime());
    for (const auto& [k, v] : md) ae.recordUserMetadata(k, v);
    std::lock_guard<std::mutex> l(mu_);
    annotations_.push_back(std::move(ae));
  }
  void pushCompileContext(std::string& md) override {
    std::lock_guard<std::mutex> l(mu_);
    compile_context_.push_back(md);
  }
  void popCompileContext() override {
    std::lock_guard<std::mutex> l(mu_);
    if (!compile_context_.empty()) compile_context_.pop_back();
  }
  void setUserMetadata(const std::string& metadata) override {
    std::lock_guard<std::mutex> l(mu_);
    user_metadata_ = metadata;
  }
  std::string getUserMetadata() override {
    std::lock_guard<std::mutex> l(mu_);
    return user_metadata_;
  }

  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> l(mu_);
    oom_observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(c10::CachingDeviceAllocator::AllocatorTraceTracker t) override {
    std::lock_guard<std::mutex> l(mu_);
    trackers_.push_back(std::move(t));
    trackers_on_.store(true);
  }

  cca::SnapshotInfo snapshot(Pool pool, bool include_traces) override;

 private:
  // Both name the ways out (issue 49). Every CUDA tensor of a process under
  // cma is cma's memory (a MemPool with another allocator included: PyTorch
  // asks this allocator for the handle), so "another allocator" is no way out.
  static constexpr const char* kNoIpc =
      "managed memory has no CUDA IPC handle (cudaIpcGetMemHandle refuses cudaMallocManaged "
      "memory), so torch.multiprocessing cannot share a CUDA tensor made under cma. Ways out: "
      "send t.cpu() (CPU shared memory; .cuda() it in the receiver), share through cma's "
      "symmetric memory (cma.torch.symmetric, over torch.distributed), or make the tensors "
      "to share in a process that does not run cma as PyTorch's allocator";
  static constexpr const char* kNoIpcOpen =
      "a process under cma cannot open another process's CUDA IPC handle (a CUDA tensor "
      "shared through torch.multiprocessing); have the sender send t.cpu(), or receive in a "
      "process that does not run cma as PyTorch's allocator";

  struct Checkpoint final : cca::AllocatorState {
    explicit Checkpoint(cma_pool_checkpoint* c) : cp(c) {}
    ~Checkpoint() override { api.pool_checkpoint_free(cp); }
    cma_pool_checkpoint* cp;
  };

  // A pool context's stream filter, shared by cma's core and the capture
  // watch (capture_watch.h).
  using Filter = std::shared_ptr<const std::function<bool(cudaStream_t)>>;
  static int CallFilter(void* ctx, void* stream) {
    try {
      return (**static_cast<Filter*>(ctx))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
    } catch (...) {  // an exception must not cross cma's C ABI
      return 0;
    }
  }
  static void DeleteFilter(void* ctx) { delete static_cast<Filter*>(ctx); }
  // The user's memory fraction of `device`; false if none was set.
  bool Fraction(c10::DeviceIndex device, double* fraction) {
    std::lock_guard<std::mutex> l(fraction_mu_);
    auto f = fractions_.find(device);
    if (f == fractions_.end()) return false;
    *fraction = f->second;
    return true;
  }

  bool Tracking() const {
    return history_on_.load(std::memory_order_relaxed) ||
           trackers_on_.load(std::memory_order_relaxed) || c10::memoryProfilingEnabled();
  }

  void* Allocate(size_t nbytes, c10::DeviceIndex device, cudaStream_t stream, const char* what) {
    if (nbytes == 0) return nullptr;  // PyTorch never dereferences empty storage
    // PyTorch's own answer (and message) for absurd sizes, before any arithmetic.
    TORCH_CHECK_WITH(OutOfMemoryError, nbytes < (size_t{1} << 60),
                     "CUDA out of memory. Tried to allocate more than 1EB memory.");
    if (C10_UNLIKELY(!enabled_.load(std::memory_order_relaxed))) {
      return AllocateUncached(nbytes, device);
    }
    if (C10_UNLIKELY(captures_.Any())) EndFailedCaptures();
    // Under memory history, what the allocation populates is traced as a
    // segment_map (reserved bytes before and after).
    const int64_t reserved_before = C10_UNLIKELY(history_on_.load(std::memory_order_relaxed))
                                        ? Get(Stats(device), "reserved_bytes.all.current")
                                        : -1;
    void* p = api.malloc(nbytes, device, stream);
    if (p == nullptr) RaiseAllocationError(nbytes, device, stream, what);
    if (Tracking()) RecordAlloc(p, nbytes, device, stream, reserved_before);
    return p;
  }

  // The uncached mode: every allocation is a managed allocation of its own,
  // freed at once by cudaFree (which waits for the device, so no stream
  // needs recording) and counted in no statistic, as PyTorch's uncached
  // allocations are. It is for tools that must see each allocation's bounds
  // (compute-sanitizer). Pointers made so stay uncached whatever the mode is
  // when they are freed.
  void* AllocateUncached(size_t nbytes, c10::DeviceIndex device) {
    c10::cuda::CUDAGuard guard(device);
    void* p = nullptr;
    const cudaError_t e = cudaMallocManaged(&p, nbytes, cudaMemAttachGlobal);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it
      TORCH_CHECK_WITH(OutOfMemoryError, false,
                       "CUDA out of memory (caching_managed_allocator, uncached mode): "
                       "cudaMallocManaged of ", nbytes, " bytes failed: ", cudaGetErrorString(e));
    }
    std::lock_guard<std::mutex> l(uncached_mu_);
    uncached_.insert(p);
    uncached_count_.fetch_add(1, std::memory_order_release);
    return p;
  }
  bool IsUncached(void* ptr) {
    if (uncached_count_.load(std::memory_order_acquire) == 0) return false;
    std::lock_guard<std::mutex> l(uncached_mu_);
    return uncached_.count(ptr) != 0;
  }
  // Frees `ptr` if the uncached mode made it; false otherwise. Runs in
  // deleters: it warns rather than throws.
  bool FreeIfUncached(void* ptr) {
    if (uncached_count_.load(std::memory_order_acquire) == 0) return false;
    {
      std::lock_guard<std::mutex> l(uncached_mu_);
      if (uncached_.erase(ptr) == 0) return false;
      uncached_count_.fetch_sub(1, std::memory_order_release);
    }
    const cudaError_t e = cudaFree(ptr);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      TORCH_WARN("caching_managed_allocator: cudaFree of an uncached allocation failed: ",
                 cudaGetErrorString(e));
    }
    return true;
  }
  static bool UncachedAtStart() {
    const char* v = std::getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }

  [[noreturn]] void RaiseAllocationError(size_t nbytes, c10::DeviceIndex device,
                                         cudaStream_t stream, const char* what);
  // reserved_before: the device's reserved bytes before the allocation, or
  // -1 (not known: no segment_map is traced).
  void RecordAlloc(void* p, size_t n, c10::DeviceIndex device, cudaStream_t stream,
                   int64_t reserved_before = -1);
  void RecordFree(void* p);
  // While a pool context is open (a capture may be under way) cma releases
  // nothing: torch.cuda.graph() and code inside use_mem_pool call
  // empty_cache, and it promises no release, only a best effort.
  void EmptyAll() {
    if (api.empty_cache() != 0 && api.last_error_code() != kFailedPrecondition) {
      Fail("emptyCache");
    }
  }
  // A pool's idle blocks. MemPool's destructor calls this right after
  // releasing the pool: an unknown pool is gone, not an error, and a
  // released one drains, so while a context is open (refused, as above) a
  // later empty_cache gives its segments back.
  void EmptyPool(Pool pool) {
    for (int d = 0, n = device_count_.load(); d < n; ++d) {
      if (api.pool_use_count(d, pool.first, pool.second) < 0) continue;
      if (api.pool_empty_cache(d, pool.first, pool.second) != 0 &&
          api.last_error_code() != kFailedPrecondition) {
        TORCH_WARN("caching_managed_allocator: emptyCache of a pool: ", LastError());
      }
    }
  }
  // Runs `empty` (memory history is on) and puts the memory it gave back in
  // the trace, as PyTorch's tools read it: segment_unmap (an arena's
  // released tail) or segment_free (a whole segment), with the caller's
  // stack when context is "all".
  void EmptyCacheTraced(const std::function<void()>& empty);
  void Trace(TraceEntry::Action action, c10::DeviceIndex device, size_t addr, size_t size,
             cudaStream_t stream, std::shared_ptr<c10::GatheredContext> context,
             bool to_trackers = true);
  std::shared_ptr<c10::GatheredContext> Context(RecordContext needed);

  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{!UncachedAtStart()};
  std::mutex uncached_mu_;
  std::unordered_set<void*> uncached_;  // the uncached mode's live allocations
  std::atomic<size_t> uncached_count_{0};  // their number: 0 keeps frees off uncached_mu_
  std::atomic<int> device_count_{0};  // written by init(), read by any thread
  std::atomic<bool> history_on_{false};
  std::atomic<bool> trackers_on_{false};
  // One traced empty_cache at a time: each compares its own before and
  // after (two at once would both trace the same release).
  std::mutex empty_cache_trace_mu_;
  std::mutex fraction_mu_;
  std::unordered_map<int, double> fractions_;  // setMemoryFraction's, per device
  std::mutex mu_;  // everything below
  cca::CreateContextFn recorder_ = nullptr;
  RecordContext when_ = RecordContext::NEVER;
  size_t max_entries_ = 1;
  std::unordered_set<int> skip_;
  std::deque<TraceEntry> traces_;
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> annotations_;
  std::vector<std::string> compile_context_;
  std::string user_metadata_;
  std::unordered_map<void*, Live> live_;
  // While tracking, each free block's last requested size by address, with
  // the order of its free: PyTorch's snapshot shows a free block's last
  // request (memory_viz's tests look for it); cma's core forgets it.
  std::map<size_t, std::pair<size_t, uint64_t>> freed_;
  uint64_t free_order_ = 0;
  std::vector<cca::OutOfMemoryObserver> oom_observers_;
  std::vector<c10::CachingDeviceAllocator::AllocatorTraceTracker> trackers_;
  c10::ApproximateClockToUnixTimeConverter clock_;
  CaptureWatch captures_;  // contexts of captures that may fail without ending them
};

extern CmaCudaAllocator* g_allocator;  // cuda_allocator.cc

}  // namespace internal
}  // namespace cma_torch

#endif  // CMA_TORCH_ALLOCATOR_H_
