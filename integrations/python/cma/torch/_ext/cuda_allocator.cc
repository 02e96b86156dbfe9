// Allocation, pools and installation of cma's PyTorch allocator
// (cuda_allocator.h).
#include "cuda_allocator.h"

#include <dlfcn.h>

namespace cma_torch {
namespace internal {

Api api;

std::string LastError() {
  const char* e = api.last_error();
  return e != nullptr ? std::string(e) : std::string("unknown error");
}

// Raises RuntimeError naming cma, the method and cma's reason.
[[noreturn]] void Fail(const char* method) {
  TORCH_CHECK(false, "caching_managed_allocator: ", std::string(method), " failed: ", LastError());
}

[[noreturn]] void Unsupported(const char* method, const char* why) {
  TORCH_CHECK(false, "caching_managed_allocator does not support ", std::string(method), ": ",
              std::string(why));
}

// A stat line of cma's statistics ("allocated_bytes.all.current", ...).
using StatMap = std::unordered_map<std::string, int64_t>;

StatMap Stats(int device) {
  std::vector<cma_stat_pair> pairs(128);
  long long n = api.stats_pairs(device, pairs.data(), pairs.size());
  if (n < 0) Fail("getDeviceStats");
  if (static_cast<size_t>(n) > pairs.size()) {
    pairs.resize(static_cast<size_t>(n));
    n = api.stats_pairs(device, pairs.data(), pairs.size());
    if (n < 0) Fail("getDeviceStats");
  }
  StatMap m;
  for (long long i = 0; i < n && static_cast<size_t>(i) < pairs.size(); ++i) {
    m.emplace(pairs[i].key, pairs[i].value);
  }
  return m;
}

int64_t Get(const StatMap& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

void FillStatArray(const StatMap& m, const std::string& name, c10::CachingAllocator::StatArray& a) {
  static const char* const kPools[] = {"all", "small_pool", "large_pool"};
  for (int i = 0; i < 3; ++i) {
    const std::string base = name + "." + kPools[i] + ".";
    a[i].current = Get(m, base + "current");
    a[i].peak = Get(m, base + "peak");
    a[i].allocated = Get(m, base + "allocated");
    a[i].freed = Get(m, base + "freed");
  }
}

cma_live_settings_info LiveSettings(const char* method) {
  cma_live_settings_info s{};
  if (api.live_settings(&s) != 0) Fail(method);
  return s;
}

CmaCudaAllocator* g_allocator = nullptr;

void Delete(void* ptr) { g_allocator->DeleteFromDataPtr(ptr); }

// ---- private pools (cuda_allocator.h): all of them cma's core pools ----

namespace {

// MemPool(allocator): the pool's segments come from that allocator, through
// cma's C ABI (cma_segment_source). The callbacks run under cma's lock and
// must not throw across it.
struct ForeignSource {
  std::shared_ptr<cca::CUDAAllocator> allocator;
};

void* ForeignAlloc(void* ctx, int device, size_t bytes, void* stream) {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    return static_cast<ForeignSource*>(ctx)->allocator->raw_alloc_with_stream(
        bytes, static_cast<cudaStream_t>(stream));
  } catch (...) {  // cma reports it as out of memory (no warning: its handler may want the GIL)
    return nullptr;
  }
}

int ForeignFree(void* ctx, int device, void* ptr, size_t) {
  try {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
    static_cast<ForeignSource*>(ctx)->allocator->raw_delete(ptr);
    return 0;
  } catch (...) {  // the segment stays cached; cma offers it again
    return -1;
  }
}

void ForeignRelease(void* ctx) { delete static_cast<ForeignSource*>(ctx); }

}  // namespace

void CmaCudaAllocator::createOrIncrefPool(c10::DeviceIndex device, Pool pool,
                                          std::shared_ptr<cca::CUDAAllocator> allocator) {
  if (allocator != nullptr && allocator.get() != this) {
    const cma_segment_source source{&ForeignAlloc, &ForeignFree, &ForeignRelease,
                                    new ForeignSource{std::move(allocator)}};
    if (api.pool_create_with_source(device, pool.first, pool.second, &source) != 0) {
      Fail("createOrIncrefPool");  // cma released the source
    }
    return;
  }
  if (api.pool_create_or_incref(device, pool.first, pool.second) != 0) {
    Fail("createOrIncrefPool");
  }
}

void CmaCudaAllocator::beginAllocateToPool(c10::DeviceIndex device, Pool pool,
                                           std::function<bool(cudaStream_t)> filter) {
  auto shared = std::make_shared<const std::function<bool(cudaStream_t)>>(std::move(filter));
  auto* ctx = new Filter(shared);  // cma's core deletes it (DeleteFilter)
  // PyTorch's setting as it stands when the capture begins
  // (torch.cuda.memory._set_allocator_settings changes it between captures).
  unsigned flags = cca::CUDAAllocatorConfig::graph_capture_record_stream_reuse()
                       ? CMA_POOL_REUSE_AFTER_JOIN
                       : 0;
  const cudaStream_t current = c10::cuda::getCurrentCUDAStream(device).stream();
  // PyTorch's capture_begin opens its context before the capture starts,
  // with a filter that accepts only a capturing stream; use_mem_pool's
  // filter accepts this thread's streams. Accepting the current stream while
  // nothing captures there, the context is no capture: cma stays active and
  // the pool keeps the shared cache's footprint (CMA_POOL_NOT_A_CAPTURE).
  if (!CapturingOrUnknown(current) && (!*shared || AcceptsStream(*shared, current))) {
    flags |= CMA_POOL_NOT_A_CAPTURE;
  }
  if (api.pool_begin_flags(device, pool.first, pool.second, &CallFilter, ctx, &DeleteFilter,
                           flags) != 0) {
    Fail("beginAllocateToPool");
  }
  captures_.Begin(device, pool, std::move(shared), current);
}

void CmaCudaAllocator::endAllocateToPool(c10::DeviceIndex device, Pool pool) {
  captures_.End(device, pool);
  EndContext(device, pool);
}

void CmaCudaAllocator::EndFailedCaptures() {
  for (const CaptureWatch::Context& c : captures_.TakeFailed()) {
    try {
      EndContext(c.device, c.pool);
    } catch (const std::exception& e) {
      TORCH_WARN("caching_managed_allocator: ending the pool context of a failed CUDA graph "
                 "capture: ", e.what());
      continue;
    }
    // Its graph never ended the capture, so it will never release the pool.
    releasePool(c.device, c.pool);
  }
}

void CmaCudaAllocator::EndContext(c10::DeviceIndex device, Pool pool) {
  if (api.pool_end(device, pool.first, pool.second) != 0) Fail("endAllocateToPool");
}

void CmaCudaAllocator::releasePool(c10::DeviceIndex device, Pool pool) {
  // Called from CUDAGraph's and MemPool's destructors: it must not throw.
  if (api.pool_release(device, pool.first, pool.second) != 0) {
    TORCH_WARN("caching_managed_allocator: releasePool: ", LastError());
  }
}

int CmaCudaAllocator::getPoolUseCount(c10::DeviceIndex device, Pool pool) {
  const int n = api.pool_use_count(device, pool.first, pool.second);
  return n < 0 ? 0 : n;  // a released, empty pool has no users (PyTorch's answer too)
}

// PyTorch calls these two only from MemPool's constructor, right after
// createOrIncrefPool: a refusal there means no MemPool is made and its
// destructor never runs, so the reference just taken is given back first
// (else the pool would never be released).
void CmaCudaAllocator::setUseOnOOM(c10::DeviceIndex device, Pool pool, bool use_on_oom) {
  // MemPool's destructor turns it off once the pool may be gone: no error then.
  if (api.pool_set_options(device, pool.first, pool.second, -1, use_on_oom ? 1 : 0) != 0 &&
      use_on_oom) {
    (void)api.pool_release(device, pool.first, pool.second);
    Fail("setUseOnOOM");
  }
}

void CmaCudaAllocator::setNoSplit(c10::DeviceIndex device, Pool pool) {
  if (api.pool_set_options(device, pool.first, pool.second, 1, -1) != 0) {
    (void)api.pool_release(device, pool.first, pool.second);
    Fail("setNoSplit");
  }
}

bool CmaCudaAllocator::checkPoolLiveAllocations(c10::DeviceIndex device, Pool pool,
                                                const std::unordered_set<void*>& expected) {
  std::vector<void*> ptrs(expected.begin(), expected.end());
  const int r = api.pool_check_live(device, pool.first, pool.second, ptrs.data(), ptrs.size());
  if (r < 0) Fail("checkPoolLiveAllocations");
  return r == 1;
}

template <typename Fn>
void Resolve(void* handle, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  TORCH_CHECK(fn != nullptr, "caching_managed_allocator: libcma.so lacks ", std::string(name),
              " (an older library than this cma package?)");
}

void LoadApi(const std::string& library) {
  if (api.malloc != nullptr) return;
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(h != nullptr, "caching_managed_allocator: cannot open ", library, ": ",
              std::string(dlerror()));
  Api loaded{};
  Resolve(h, "cma_malloc", loaded.malloc);
  Resolve(h, "cma_free", loaded.free);
  Resolve(h, "cma_record_stream", loaded.record_stream);
  Resolve(h, "cma_allocation_size", loaded.allocation_size);
  Resolve(h, "cma_empty_cache", loaded.empty_cache);
  Resolve(h, "cma_last_error", loaded.last_error);
  Resolve(h, "cma_last_error_code", loaded.last_error_code);
  Resolve(h, "cma_mem_info", loaded.mem_info);
  Resolve(h, "cma_set_memory_fraction", loaded.set_memory_fraction);
  Resolve(h, "cma_reset_peak_stats", loaded.reset_peak_stats);
  Resolve(h, "cma_reset_accumulated_stats", loaded.reset_accumulated_stats);
  Resolve(h, "cma_stats_pairs", loaded.stats_pairs);
  Resolve(h, "cma_snapshot_visit", loaded.snapshot_visit);
  Resolve(h, "cma_pool_create_or_incref", loaded.pool_create_or_incref);
  Resolve(h, "cma_pool_create_with_source", loaded.pool_create_with_source);
  Resolve(h, "cma_pool_begin_flags", loaded.pool_begin_flags);
  Resolve(h, "cma_pool_end", loaded.pool_end);
  Resolve(h, "cma_pool_release", loaded.pool_release);
  Resolve(h, "cma_pool_use_count", loaded.pool_use_count);
  Resolve(h, "cma_pool_set_options", loaded.pool_set_options);
  Resolve(h, "cma_pool_empty_cache", loaded.pool_empty_cache);
  Resolve(h, "cma_pool_check_live", loaded.pool_check_live);
  Resolve(h, "cma_live_settings", loaded.live_settings);
  Resolve(h, "cma_pool_checkpoint_take", loaded.pool_checkpoint_take);
  Resolve(h, "cma_pool_checkpoint_free", loaded.pool_checkpoint_free);
  Resolve(h, "cma_pool_checkpoint_restore", loaded.pool_checkpoint_restore);
  api = loaded;
}

}  // namespace internal

using internal::api;
using internal::g_allocator;
using internal::CmaCudaAllocator;
namespace cca = c10::cuda::CUDACachingAllocator;

// Makes cma the process's CUDA allocator. `library` is the libcma.so that
// cma._lib loaded. Refused once PyTorch's current allocator has initialised
// (it owns memory then), as PyTorch's own change_current_allocator refuses.
void install(const std::string& library) {
  if (g_allocator != nullptr) return;
  cca::CUDAAllocator* current = cca::get();
  TORCH_CHECK(current == nullptr || !current->initialized(),
              "caching_managed_allocator: PyTorch's CUDA allocator is already initialised; "
              "call cma.torch.use_as_default() before anything uses CUDA");
  internal::LoadApi(library);
  g_allocator = new CmaCudaAllocator();  // never destroyed: tensors outlive everything
  cca::allocator.store(g_allocator);
  c10::SetAllocator(c10::DeviceType::CUDA, g_allocator);
}

// cpu_allocator.cc
void cpu_on(const std::string& library);
void cpu_off();

}  // namespace cma_torch

#ifdef TORCH_EXTENSION_NAME  // built by torch.utils.cpp_extension (cma/torch/_ext/build.py)
#include <torch/extension.h>  // at::Tensor arguments from Python
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

namespace cma_torch {

// An alias that cma.torch's zero-copy .to() made over `source`'s memory
// counts in-place writes with `source`'s version counter: autograd then
// sees a write through either (a saved tensor modified in place raises at
// backward, as for views), where separate counters would let a gradient be
// computed from overwritten data. Inference tensors have no counter to
// share: left as they are.
void share_version_counter(const at::Tensor& alias, const at::Tensor& source) {
  if (alias.is_inference() || source.is_inference()) return;
  alias.unsafeGetTensorImpl()->set_version_counter(
      source.unsafeGetTensorImpl()->version_counter());
}

}  // namespace cma_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &cma_torch::install, "Makes cma PyTorch's CUDA allocator.");
  m.def("cpu_on", &cma_torch::cpu_on, "Makes cma PyTorch's CPU allocator (managed memory).");
  m.def("cpu_off", &cma_torch::cpu_off, "Gives PyTorch its previous CPU allocator back.");
  m.def("share_version_counter", &cma_torch::share_version_counter,
        "The alias counts in-place writes with the source's version counter.");
}
#endif

