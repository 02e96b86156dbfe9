"""The allocation hook PyTorch calls, with real out-of-memory errors.

PyTorch's CUDAPluggableAllocator stores whatever pointer the allocation hook
returns and never checks it for NULL, so a failed allocation would become a
tensor at address 0. The one way to raise torch.OutOfMemoryError (what the
native allocator raises, and what OOM handlers, batch-size finders and
Lightning catch) is to throw c10::OutOfMemoryError in C++ from the hook.
That needs PyTorch's own headers and ABI, so a tiny C++ shim is compiled
against the installed torch on first use (torch.utils.cpp_extension, cached
in TORCH_EXTENSIONS_DIR like any extension) and wraps cma_torch_alloc:
an out-of-memory throws OutOfMemoryError with cma's message and statistics;
any other failure throws c10::Error (RuntimeError) with cma's message.
"""
import ctypes
import warnings

_SOURCE = r"""
#include <c10/util/Exception.h>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <cstdio>
#include <string>
#include <utility>

// cudaStream_t as CUDA declares it, without CUDA's headers.
struct CUstream_st;
using cudaStream_t = CUstream_st*;
using MempoolId = std::pair<unsigned long long, unsigned long long>;  // c10::cuda::MempoolId_t

namespace {
using AllocFn = void* (*)(size_t, int, void*);
using ErrorFn = const char* (*)();
using CodeFn = int (*)();
using MemInfoFn = int (*)(int, size_t*, size_t*);
using FilterFn = int (*)(void*, void*);
using PoolBeginFn = int (*)(int, unsigned long long, unsigned long long, FilterFn, void*,
                            void (*)(void*));
using PoolFn = int (*)(int, unsigned long long, unsigned long long);
AllocFn g_alloc = nullptr;
MemInfoFn g_mem_info = nullptr;
PoolBeginFn g_pool_begin = nullptr;
PoolFn g_pool_end = nullptr;
PoolFn g_pool_release = nullptr;
ErrorFn g_error = nullptr;
CodeFn g_code = nullptr;
constexpr int kResourceExhausted = 8;  // absl::StatusCode
}  // namespace

extern "C" void* cma_torch_alloc_checked(size_t size, int device, void* stream) {
  void* p = g_alloc(size, device, stream);
  if (p == nullptr && size != 0) {
    // Numbers are formatted here with snprintf and only strings reach
    // TORCH_CHECK: formatting a number through an iostream in this process
    // crashed on the GPU machine (two C++ runtimes' locale facets, it
    // seems), so no number goes through one.
    const std::string why = g_error();  // the next cma call replaces it
    const int code = g_code();
    size_t free_bytes = 0, total_bytes = 0;
    const bool known = g_mem_info(device, &free_bytes, &total_bytes) == 0;
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    char msg[512];
    // Like PyTorch's own allocator, any request the device cannot hold is
    // an out-of-memory error: over the budget, or larger than the device.
    if (code == kResourceExhausted || (known && size > total_bytes)) {
      std::snprintf(msg, sizeof(msg),
                    "CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity "
                    "of %.2f GiB of which %.2f GiB is free. (caching_managed_allocator) ",
                    size / kGiB, device, total_bytes / kGiB, free_bytes / kGiB);
      TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(msg), why);
    }
    std::snprintf(msg, sizeof(msg),
                  "caching_managed_allocator: allocation of %zu bytes on device %d failed: ",
                  size, device);
    TORCH_CHECK(false, std::string(msg), why);
  }
  return p;
}

// CUDA graph capture and MemPool routing: PyTorch announces a capture's
// private pool through these hooks; cma's core routes the capture's
// allocations there and makes no call that would break the capture. The
// filter PyTorch passes (is this stream the capture's?) is kept until the
// pool context ends.
using Filter = std::function<bool(cudaStream_t)>;

int CallFilter(void* ctx, void* stream) {
  try {
    return (*static_cast<Filter*>(ctx))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
  } catch (...) {  // never let an exception cross the C ABI
    return 0;
  }
}

void DeleteFilter(void* ctx) { delete static_cast<Filter*>(ctx); }

void cma_torch_begin_allocate_to_pool(int device, MempoolId id, Filter filter) {
  auto* ctx = new Filter(std::move(filter));
  if (g_pool_begin(device, id.first, id.second, &CallFilter, ctx, &DeleteFilter) != 0) {
    TORCH_CHECK(false, "caching_managed_allocator: could not route allocations to a private "
                "pool: ", std::string(g_error()));
  }
}

void cma_torch_end_allocate_to_pool(int device, MempoolId id) {
  if (g_pool_end(device, id.first, id.second) != 0) {
    TORCH_CHECK(false, "caching_managed_allocator: ", std::string(g_error()));
  }
}

// Called from a graph's destructor: it must not throw.
void cma_torch_release_pool(int device, MempoolId id) {
  (void)g_pool_release(device, id.first, id.second);
}

int64_t graph_hook(int64_t which) {
  switch (which) {
    case 0: return reinterpret_cast<int64_t>(&cma_torch_begin_allocate_to_pool);
    case 1: return reinterpret_cast<int64_t>(&cma_torch_end_allocate_to_pool);
    default: return reinterpret_cast<int64_t>(&cma_torch_release_pool);
  }
}

int64_t bind(int64_t alloc, int64_t error, int64_t code, int64_t mem_info, int64_t pool_begin,
             int64_t pool_end, int64_t pool_release) {
  g_pool_begin = reinterpret_cast<PoolBeginFn>(pool_begin);
  g_pool_end = reinterpret_cast<PoolFn>(pool_end);
  g_pool_release = reinterpret_cast<PoolFn>(pool_release);
  g_alloc = reinterpret_cast<AllocFn>(alloc);
  g_error = reinterpret_cast<ErrorFn>(error);
  g_code = reinterpret_cast<CodeFn>(code);
  g_mem_info = reinterpret_cast<MemInfoFn>(mem_info);
  return reinterpret_cast<int64_t>(&cma_torch_alloc_checked);
}
"""

_checked = None
_hooks = []  # begin/end allocate-to-pool and release-pool, when the shim built


def _address(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def checked_alloc_fn(lib):
    """Address of the checking hook, or None (with a warning) if the shim
    cannot be built here (no C++ compiler): then a failed allocation is a
    NULL tensor, as with any plain pluggable allocator."""
    global _checked
    if _checked is None:
        try:
            from torch.utils import cpp_extension
            mod = cpp_extension.load_inline(
                name="cma_torch_shim_v4", cpp_sources=_SOURCE, functions=["bind", "graph_hook"],
                extra_cflags=["-O2"], verbose=False)
            _checked = mod.bind(_address(lib, "cma_torch_alloc"), _address(lib, "cma_last_error"),
                                _address(lib, "cma_last_error_code"), _address(lib, "cma_mem_info"),
                                _address(lib, "cma_pool_begin"), _address(lib, "cma_pool_end"),
                                _address(lib, "cma_pool_release"))
            _hooks.extend(mod.graph_hook(i) for i in range(3))
        except Exception as e:  # noqa: BLE001 - any build failure falls back, loudly
            warnings.warn("cma.torch: could not build the out-of-memory shim (%s); an "
                          "out-of-memory will return a null tensor instead of raising "
                          "torch.OutOfMemoryError" % e)
            _checked = 0
    return _checked or None


def graph_hooks(lib):
    """Addresses of the CUDA graph pool hooks (routing a capture's
    allocations to its private pool in cma), or []."""
    checked_alloc_fn(lib)
    return list(_hooks)
