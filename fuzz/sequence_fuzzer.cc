// libFuzzer: a byte string drives alloc / free / record_stream / move /
// hints / stream progress / empty_cache on the host backend (with injected
// backend faults), and the allocator's invariant checker runs after every
// step. Any inconsistency, crash or leak aborts.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "allocator/caching_managed_allocator.h"
#include "backends/fault/fault_injecting_backend.h"
#include "backends/host/host_backend.h"

namespace {

struct Reader {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t Byte() { return n ? (--n, *p++) : 0; }
  std::uint32_t Word() { return Byte() | Byte() << 8 | Byte() << 16 | std::uint32_t{Byte()} << 24; }
};

void Check(cma::CachingManagedAllocator& a) {
  if (!a.CheckInvariants().ok()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader in{data, size};
  cma::HostBackend host({.device_count = 2, .device_capacity = 64 << 20,
                         .manual_completion = true});
  cma::FaultInjectingBackend faulty(host);
  const char* configs[] = {"", "release_before_peak:1", "max_split_size_mb:4",
                           "discard_on_free:1,prefetch:on_move", "release_threshold:1M",
                           "roundup_power2_divisions:4,garbage_collection_threshold:0.5"};
  auto made = cma::CachingManagedAllocator::Create(faulty, configs[in.Byte() % 6]);
  if (!made.ok()) std::abort();
  auto& a = **made;
  cma::FaultPlan plan;
  plan.probability = (in.Byte() % 4) * 0.02;
  plan.seed = in.Byte();
  plan.slow_event_queries = in.Byte() % 3;
  faulty.SetPlan(plan);
  std::vector<cma::Stream> streams = {cma::kDefaultStream, *host.CreateStream(0),
                                      *host.CreateStream(0), *host.CreateStream(1)};
  std::vector<void*> live;
  for (int step = 0; step < 200 && in.n > 0; ++step) {
    const std::uint8_t op = in.Byte() % 8;
    const cma::Stream s = streams[in.Byte() % streams.size()];
    switch (op) {
      case 0:
      case 1: {
        const std::size_t bytes = in.Word() % (24u << 20);  // 0 and huge included
        const int device = in.Byte() % 3 - (op == 1 ? 1 : 0);  // sometimes invalid
        auto p = a.Allocate(bytes, device, s);
        if (p.ok()) live.push_back(*p);
        break;
      }
      case 2:
        if (!live.empty()) {
          const std::size_t i = in.Byte() % live.size();
          (void)a.Free(live[i]);
          live.erase(live.begin() + i);
        } else {
          int x;
          if (a.Free(&x).ok()) std::abort();  // foreign pointers never succeed
        }
        break;
      case 3:
        if (!live.empty()) {
          void* p = live[in.Byte() % live.size()];
          (void)a.RecordStream(p, s);
          (void)host.EnqueueWork(s);
        }
        break;
      case 4:
        (void)host.CompleteWork(s);
        break;
      case 5:
        if (!live.empty()) {
          void* p = live[in.Byte() % live.size()];
          const int where = in.Byte() % 3;
          (void)a.Move(p, where == 2 ? cma::Location::Host() : cma::Location::Device(where), s,
                       in.Byte() & 1);
        }
        break;
      case 6:
        if (!live.empty()) {
          cma::AllocationHints h;
          h.read_mostly = in.Byte() & 1;
          h.accessed_by = {in.Byte() % 3};
          (void)a.SetHints(live[in.Byte() % live.size()], h);
        }
        break;
      case 7:
        (void)a.EmptyCache();
        break;
    }
    Check(a);
  }
  faulty.SetPlan({});
  for (void* p : live) {
    if (!a.Free(p).ok()) std::abort();
  }
  Check(a);
  made->reset();
  for (std::size_t i = 1; i < streams.size(); ++i) (void)host.DestroyStream(streams[i]);
  const cma::HostResourceCounts left = host.LiveResources();
  if (left.managed_allocations != 0 || left.events != 0) std::abort();  // nothing leaks
  return 0;
}
