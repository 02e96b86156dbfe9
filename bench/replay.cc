#include "bench/replay.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace cma {
namespace {

struct Pass {
  std::int64_t ops = 0;
  std::int64_t skipped_frees = 0;
  std::int64_t peak_requested = 0;
  std::int64_t ooms = 0;
  std::int64_t lowest_free = -1;
  std::chrono::nanoseconds spent{0};
};

// One pass over the trace; every block it allocates is freed before it returns.
absl::Status RunPass(CachingManagedAllocator& allocator, int device,
                     const std::vector<TraceOp>& ops,
                     const absl::flat_hash_map<std::uint64_t, Stream>& streams, bool sample,
                     Pass& pass) {
  Backend& backend = allocator.backend();
  absl::flat_hash_map<std::uint64_t, std::pair<void*, std::uint64_t>> live;
  std::int64_t requested = 0;
  absl::Status failure;
  for (const TraceOp& op : ops) {
    const Stream stream = op.stream == 0 ? kDefaultStream : streams.at(op.stream);
    if (op.alloc) {
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<void*> p = allocator.Allocate(op.size, device, stream);
      pass.spent += std::chrono::steady_clock::now() - t0;
      ++pass.ops;
      if (!p.ok()) {
        if (absl::IsResourceExhausted(p.status())) {
          ++pass.ooms;
          continue;
        }
        failure = p.status();
        break;
      }
      live[op.addr] = {*p, op.size};
      requested += static_cast<std::int64_t>(op.size);
      pass.peak_requested = std::max(pass.peak_requested, requested);
      if (sample) {
        // Placement is stream-ordered: let it happen before looking.
        (void)backend.SynchronizeStream(stream);
        absl::StatusOr<MemInfo> m = backend.GetMemInfo(device);
        if (m.ok()) {
          const auto free_now = static_cast<std::int64_t>(m->free_bytes);
          pass.lowest_free = pass.lowest_free < 0 ? free_now : std::min(pass.lowest_free, free_now);
        }
      }
    } else {
      auto it = live.find(op.addr);
      if (it == live.end()) {
        ++pass.skipped_frees;
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = allocator.Free(it->second.first);
      pass.spent += std::chrono::steady_clock::now() - t0;
      ++pass.ops;
      if (!s.ok()) {
        failure = s;
        break;
      }
      requested -= static_cast<std::int64_t>(it->second.second);
      live.erase(it);
    }
  }
  for (auto& [addr, p] : live) (void)allocator.Free(p.first);
  return failure;
}

}  // namespace

absl::StatusOr<ReplayResult> Replay(CachingManagedAllocator& allocator, int device,
                                    const std::vector<TraceOp>& ops, const std::string& name,
                                    const ReplayOptions& options) {
  Backend& backend = allocator.backend();
  absl::flat_hash_map<std::uint64_t, Stream> streams;
  for (const TraceOp& op : ops) {
    if (op.stream == 0 || streams.contains(op.stream)) continue;
    absl::StatusOr<Stream> s = backend.CreateStream(device);
    if (!s.ok()) return s.status();
    streams[op.stream] = *s;
  }
  constexpr MemPoolId kPool{0xC0FFEE, 1};
  int pool_refs = 0;  // the pool's own reference, then its context's
  auto cleanup = [&]() {
    if (pool_refs == 2) (void)allocator.EndAllocateToPool(device, kPool);
    for (; pool_refs > 0; --pool_refs) (void)allocator.ReleasePool(device, kPool);
    (void)allocator.EmptyCache();
    for (auto& [id, s] : streams) (void)backend.DestroyStream(s);
  };
  const DeviceStats before = *allocator.GetStats(device);
  if (absl::Status s = allocator.ResetPeakStats(device); !s.ok()) return s;
  std::int64_t free_at_start = -1;
  if (options.sample_device_memory) {
    (void)backend.SynchronizeStream(kDefaultStream);
    absl::StatusOr<MemInfo> m = backend.GetMemInfo(device);
    if (m.ok()) free_at_start = static_cast<std::int64_t>(m->free_bytes);
  }

  if (options.in_pool) {
    absl::Status s = allocator.CreateOrIncrefPool(device, kPool);
    pool_refs = s.ok() ? 1 : 0;
    PoolContextOptions context;
    context.not_a_capture = true;
    if (s.ok()) s = allocator.BeginAllocateToPool(device, kPool, nullptr, context);
    pool_refs += s.ok() && pool_refs == 1 ? 1 : 0;
    if (!s.ok()) {
      cleanup();
      return s;
    }
  }
  ReplayResult r;
  r.trace = options.in_pool ? absl::StrCat(name, " (MemPool)") : name;
  Pass first;
  if (absl::Status s = RunPass(allocator, device, ops, streams,
                               options.sample_device_memory && free_at_start >= 0, first);
      !s.ok()) {
    cleanup();
    return s;
  }
  const DeviceStats after_first = *allocator.GetStats(device);

  // Second pass: the cache is warm, as in every training step after the first.
  const std::int64_t calls_before = options.calls ? options.calls() : 0;
  Pass second;
  if (absl::Status s = RunPass(allocator, device, ops, streams, false, second); !s.ok()) {
    cleanup();
    return s;
  }
  const std::int64_t calls_after = options.calls ? options.calls() : 0;
  const DeviceStats after_second = *allocator.GetStats(device);
  cleanup();

  r.ops = first.ops;
  r.skipped_frees = first.skipped_frees;
  r.ooms = first.ooms + second.ooms;
  r.peak_requested = first.peak_requested;
  r.peak_reserved = after_first.reserved_bytes[kAllPools].peak;
  r.ratio = r.peak_requested ? static_cast<double>(r.peak_reserved) / r.peak_requested : 0;
  if (first.lowest_free >= 0) {
    r.peak_device_used = free_at_start - first.lowest_free;
    r.device_ratio =
        r.peak_requested ? static_cast<double>(r.peak_device_used) / r.peak_requested : 0;
  }
  r.backend_allocs = after_first.num_device_alloc - before.num_device_alloc;
  r.ns_per_op = first.ops ? static_cast<double>(first.spent.count()) / first.ops : 0;
  r.steady_ns_per_op = second.ops ? static_cast<double>(second.spent.count()) / second.ops : 0;
  if (options.calls && second.ops) {
    r.steady_backend_calls_per_op = static_cast<double>(calls_after - calls_before) / second.ops;
  }
  r.steady_pages_populated = after_second.num_pages_populated - after_first.num_pages_populated;
  r.steady_pages_discarded = after_second.num_pages_discarded - after_first.num_pages_discarded;
  return r;
}

}  // namespace cma
