#include "bench/replay.h"

#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace cma {

absl::StatusOr<ReplayResult> Replay(CachingManagedAllocator& allocator, int device,
                                    const std::vector<TraceOp>& ops, const std::string& name) {
  Backend& backend = allocator.backend();
  absl::flat_hash_map<std::uint64_t, Stream> streams;
  for (const TraceOp& op : ops) {
    if (op.stream == 0 || streams.contains(op.stream)) continue;
    absl::StatusOr<Stream> s = backend.CreateStream(device);
    if (!s.ok()) return s.status();
    streams[op.stream] = *s;
  }
  const DeviceStats before = *allocator.GetStats(device);
  if (absl::Status s = allocator.ResetPeakStats(device); !s.ok()) return s;

  ReplayResult r;
  r.trace = name;
  absl::flat_hash_map<std::uint64_t, std::pair<void*, std::uint64_t>> live;
  std::int64_t requested = 0;
  absl::Status failure;
  std::chrono::nanoseconds spent{0};
  for (const TraceOp& op : ops) {
    const Stream stream = op.stream == 0 ? kDefaultStream : streams[op.stream];
    if (op.alloc) {
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<void*> p = allocator.Allocate(op.size, device, stream);
      spent += std::chrono::steady_clock::now() - t0;
      ++r.ops;
      if (!p.ok()) {
        if (absl::IsResourceExhausted(p.status())) {
          ++r.ooms;
          continue;
        }
        failure = p.status();
        break;
      }
      live[op.addr] = {*p, op.size};
      requested += static_cast<std::int64_t>(op.size);
      r.peak_requested = std::max(r.peak_requested, requested);
    } else {
      auto it = live.find(op.addr);
      if (it == live.end()) {
        ++r.skipped_frees;
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = allocator.Free(it->second.first);
      spent += std::chrono::steady_clock::now() - t0;
      ++r.ops;
      if (!s.ok()) {
        failure = s;
        break;
      }
      requested -= static_cast<std::int64_t>(it->second.second);
      live.erase(it);
    }
  }
  for (auto& [addr, p] : live) (void)allocator.Free(p.first);
  const DeviceStats after = *allocator.GetStats(device);
  (void)allocator.EmptyCache();
  for (auto& [id, s] : streams) (void)backend.DestroyStream(s);
  if (!failure.ok()) return failure;
  r.peak_reserved = after.reserved_bytes[kAllPools].peak;
  r.ratio = r.peak_requested ? static_cast<double>(r.peak_reserved) / r.peak_requested : 0;
  r.backend_allocs = after.num_device_alloc - before.num_device_alloc;
  r.ns_per_op = r.ops ? static_cast<double>(spent.count()) / r.ops : 0;
  return r;
}

}  // namespace cma
