// cma as PyTorch's CPU allocator (PyTorch RFC-0023's "big switch"): while
// on, every CPU tensor PyTorch allocates (torch.empty, torch.load's storages,
// a DataLoader's collated batch in the main process) is managed memory from
// cma's host pool (cma_malloc with location -1), so that cma.torch can move
// it to a GPU without a copy. Compiled into the same extension as the CUDA
// allocator (build.py) and installed by cma.torch.managed_cpu().
//
// Contract:
//  * Thread safety: allocate and free may be called from any thread; on and
//    off are called by Python under the GIL.
//  * Ownership: a tensor allocated while on is freed by cma whenever it dies,
//    also after the switch is turned off; a tensor allocated while off keeps
//    PyTorch's own deleter.
//  * A forked child (a DataLoader worker) must not call the CUDA runtime
//    that its parent initialised: there, allocations come from PyTorch's
//    previous CPU allocator and frees of the parent's tensors do nothing.
//    CUDA does not copy managed memory into the child at all: a child that
//    reads a tensor its parent made under the switch is killed (SIGSEGV); a
//    fork while such tensors live says so on stderr, once. raw_deallocate
//    in the child of memory raw_allocate'd there leaks (c10 frees it through
//    raw_deleter(), which cannot tell the previous allocator's from ours).
//  * Errors: out of memory raises torch.OutOfMemoryError naming cma's host
//    pool; any other failure raises RuntimeError with cma's reason. A free
//    that fails (never expected) is reported on stderr, not thrown: c10
//    deleters must not throw.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "cuda_allocator.h"  // internal::api, LoadApi and kResourceExhausted

namespace cma_torch {
namespace {

using internal::api;
using internal::kResourceExhausted;

c10::Allocator* g_previous = nullptr;
bool g_on = false;  // as PyTorch's CPU allocator; changed under the GIL
std::atomic<bool> g_forked{false};
std::atomic<long long> g_live{0};

void MarkForked() { g_forked.store(true, std::memory_order_relaxed); }

// Runs in the parent before a fork: CUDA does not copy managed memory into
// the child, which is killed if it touches any. Said once per process, since
// the child's own crash report (a DataLoader worker's) cannot say why.
void WarnBeforeFork() {
  static std::atomic<bool> said{false};
  if (!g_on || g_live.load(std::memory_order_relaxed) == 0 || said.exchange(true)) return;
  static const char kMessage[] =
      "caching_managed_allocator: forking while CPU tensors live in managed memory "
      "(cma.torch.managed_cpu()): the child cannot read them (CUDA does not copy managed memory "
      "into children) and is killed if it does; a DataLoader whose Dataset holds such tensors "
      "needs multiprocessing_context=\"spawn\" or \"forkserver\" (said once)\n";
  ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  (void)ignored;
}

void DeleteManaged(void* p) {
  if (p == nullptr || g_forked.load(std::memory_order_relaxed)) return;
  g_live.fetch_sub(1, std::memory_order_relaxed);
  if (api.free(p) != 0) {
    std::fprintf(stderr, "caching_managed_allocator: freeing CPU tensor memory %p failed: %s\n", p,
                 api.last_error());
  }
}

class CmaCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (g_forked.load(std::memory_order_relaxed)) return g_previous->allocate(n);
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &DeleteManaged, cpu};
    void* p = api.malloc(n, -1, nullptr);
    if (p == nullptr) {
      const std::string why = api.last_error();
      TORCH_CHECK_WITH(OutOfMemoryError, api.last_error_code() != kResourceExhausted,
                       "caching_managed_allocator: CPU tensor of ", std::to_string(n),
                       " bytes: ", why);
      TORCH_CHECK(false, "caching_managed_allocator: CPU tensor of ", std::to_string(n),
                  " bytes: ", why);
    }
    g_live.fetch_add(1, std::memory_order_relaxed);
    return {p, p, &DeleteManaged, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &DeleteManaged; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

CmaCpuAllocator g_cpu_allocator;

}  // namespace

// Makes cma PyTorch's CPU allocator. `library` is the libcma.so that cma._lib
// loaded. Idempotent.
void cpu_on(const std::string& library) {
  internal::LoadApi(library);
  static bool atfork_registered = false;  // under the GIL
  if (!atfork_registered) {
    pthread_atfork(&WarnBeforeFork, nullptr, &MarkForked);
    atfork_registered = true;
  }
  c10::Allocator* current = c10::GetCPUAllocator();
  if (current == &g_cpu_allocator) return;
  TORCH_CHECK(!g_forked.load(), "caching_managed_allocator: managed CPU tensors cannot be turned "
                                "on in a forked child (its CUDA runtime is unusable)");
  g_previous = current;
  c10::SetCPUAllocator(&g_cpu_allocator, /*priority=*/0);
  TORCH_CHECK(c10::GetCPUAllocator() == &g_cpu_allocator,
              "caching_managed_allocator: PyTorch kept its CPU allocator (another allocator was "
              "registered with a higher priority)");
  g_on = true;
}

// Gives PyTorch its previous CPU allocator back. Tensors allocated while on
// stay cma's until they die.
void cpu_off() {
  if (c10::GetCPUAllocator() != &g_cpu_allocator || g_previous == nullptr) return;
  c10::SetCPUAllocator(g_previous, /*priority=*/0);
  g_on = false;
}

}  // namespace cma_torch
