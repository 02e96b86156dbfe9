// Allocation history for tools (PyTorch's _record_memory_history and the
// device_traces of its snapshot): a bounded ring of alloc and free events,
// recorded by the C ABI while enabled. Disabled, it costs one relaxed load
// per call.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "backends/mutex_lock.h"
#include "integrations/c/cma_c.h"
#include "integrations/c/cma_c_internal.h"

namespace cma {
namespace capi {
namespace {

struct Event {
  const char* action;  // "alloc" | "free_requested" | "free_completed"
  std::uintptr_t addr;
  std::size_t size;
  int device;
  std::uintptr_t stream;
  std::int64_t time_us;
};

struct History {
  std::atomic<bool> enabled{false};
  absl::Mutex mu;
  std::size_t max_entries ABSL_GUARDED_BY(mu) = 0;
  std::deque<Event> events ABSL_GUARDED_BY(mu);
  struct Live {
    std::size_t size;
    int device;
    std::uintptr_t stream;
  };
  absl::flat_hash_map<std::uintptr_t, Live> live ABSL_GUARDED_BY(mu);
};

History& H() {
  static History* h = new History;  // never destroyed
  return *h;
}

std::int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Push(History& h, Event e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(h.mu) {
  h.events.push_back(e);
  while (h.events.size() > h.max_entries) h.events.pop_front();
}

}  // namespace

void RecordAlloc(void* p, std::size_t size, int device, void* stream) {
  History& h = H();
  if (!h.enabled.load(std::memory_order_relaxed) || p == nullptr) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  const auto s = reinterpret_cast<std::uintptr_t>(stream);
  MutexLock l(&h.mu);
  h.live[addr] = {size, device, s};
  Push(h, {"alloc", addr, size, device, s, NowUs()});
}

void RecordFree(void* p) {
  History& h = H();
  if (!h.enabled.load(std::memory_order_relaxed) || p == nullptr) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  MutexLock l(&h.mu);
  auto it = h.live.find(addr);
  if (it == h.live.end()) return;  // allocated before recording began
  const std::int64_t t = NowUs();
  // cma frees at once (other streams' uses are its events, not a delay
  // visible here): requested and completed together.
  Push(h, {"free_requested", addr, it->second.size, it->second.device, it->second.stream, t});
  Push(h, {"free_completed", addr, it->second.size, it->second.device, it->second.stream, t});
  h.live.erase(it);
}

}  // namespace capi
}  // namespace cma

extern "C" {

int cma_record_history(int enabled, int max_entries) {
  cma::capi::History& h = cma::capi::H();
  if (enabled && max_entries <= 0) {
    return cma::capi::Fail(absl::InvalidArgumentError(
        "cma_record_history: max_entries must be positive when enabling"));
  }
  cma::MutexLock l(&h.mu);
  if (enabled) {
    h.max_entries = static_cast<std::size_t>(max_entries);
    while (h.events.size() > h.max_entries) h.events.pop_front();
  } else {
    h.events.clear();
    h.live.clear();
  }
  h.enabled.store(enabled != 0, std::memory_order_relaxed);
  return 0;
}

char* cma_history_json(void) {
  cma::capi::History& h = cma::capi::H();
  nlohmann::json out = nlohmann::json::array();
  cma::MutexLock l(&h.mu);
  for (const cma::capi::Event& e : h.events) {
    out.push_back({{"action", e.action},
                   {"addr", e.addr},
                   {"size", e.size},
                   {"device", e.device},
                   {"stream", e.stream},
                   {"time_us", e.time_us}});
  }
  return cma::capi::CopyString(out.dump());
}

}  // extern "C"
