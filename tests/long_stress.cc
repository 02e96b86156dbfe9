// The long randomized stress run: >= 1,000,000 operations from 16 threads on
// 8 streams over 2 devices, mixed sizes, out-of-memory pressure from a small
// device capacity, cross-stream use with pending "kernels", moves, hints and
// cache releases. Every live block carries a tag checked before it is freed
// (two callers handed overlapping memory would break it); the invariant
// checker runs every few thousand operations and at the end; nothing may
// leak. Prints a summary of what it checked.
//   bazel run -c opt //tests:long_stress -- --ops=1000000
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "allocator/caching_managed_allocator.h"
#include "backends/host/host_backend.h"
#include "tests/block_tag.h"

ABSL_FLAG(long, ops, 1000000, "total operations across all threads");
ABSL_FLAG(int, threads, 16, "threads");
ABSL_FLAG(int, check_every, 1000, "operations per thread between invariant checks");

namespace cma {
namespace {

struct Counters {
  std::atomic<long> allocs{0}, frees{0}, ooms{0}, rejected{0}, record_streams{0}, moves{0},
      hints{0}, progress{0}, empty_caches{0}, tag_checks{0}, invariant_checks{0}, failures{0};
};

int Main() {
  const long total = absl::GetFlag(FLAGS_ops);
  const int threads = absl::GetFlag(FLAGS_threads);
  const int check_every = absl::GetFlag(FLAGS_check_every);
  HostBackend backend({.device_count = 2, .device_capacity = 256 << 20, .manual_completion = true});
  auto made = CachingManagedAllocator::Create(backend, "release_threshold:96M");
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  CachingManagedAllocator& a = **made;
  std::vector<Stream> streams[2];  // 4 per device: 8 streams
  for (int d = 0; d < 2; ++d) {
    for (int i = 0; i < 4; ++i) streams[d].push_back(*backend.CreateStream(d));
  }
  Counters c;
  std::atomic<std::uint64_t> next_tag{1};
  const absl::Time t0 = absl::Now();
  auto worker = [&](int id) {
    std::mt19937_64 rng(0x5eed + id);
    std::vector<TaggedBlock> live;
    const long mine = total / threads;
    for (long op = 0; op < mine && c.failures == 0; ++op) {
      const int dev = rng() % 2;
      const Stream s = streams[dev][rng() % 4];
      const int kind = rng() % 100;
      if (kind < 45 || live.empty()) {
        const int size_class = rng() % 20;
        std::size_t n = size_class < 12   ? 16 + rng() % 8192
                        : size_class < 18 ? (1 << 20) + rng() % (8 << 20)
                        : size_class < 19 ? (16 << 20) + rng() % (48 << 20)
                                          : 0;  // bad input now and then
        auto p = a.Allocate(n, dev, s);
        if (!p.ok()) {
          (absl::IsResourceExhausted(p.status()) ? c.ooms : c.rejected)++;
          if (n != 0 && !absl::IsResourceExhausted(p.status())) {
            std::fprintf(stderr, "allocate %zu: %s\n", n, p.status().ToString().c_str());
            c.failures++;
          }
          continue;
        }
        TaggedBlock l{*p, n, next_tag++};
        l.Write();
        live.push_back(l);
        c.allocs++;
      } else if (kind < 85) {
        const std::size_t i = rng() % live.size();
        c.tag_checks++;
        if (!live[i].Intact()) {
          std::fprintf(stderr, "block %p overwritten: handed out twice\n", live[i].ptr);
          c.failures++;
        }
        if (absl::Status st = a.Free(live[i].ptr); !st.ok()) {
          std::fprintf(stderr, "free: %s\n", st.ToString().c_str());
          c.failures++;
        }
        live[i] = live.back();
        live.pop_back();
        c.frees++;
      } else if (kind < 90) {
        const TaggedBlock& l = live[rng() % live.size()];
        const int d = *a.DeviceOf(l.ptr);
        const Stream other = streams[d][rng() % 4];
        if (absl::Status st = a.RecordStream(l.ptr, other); !st.ok()) {
          std::fprintf(stderr, "record_stream: %s\n", st.ToString().c_str());
          c.failures++;
        }
        (void)backend.EnqueueWork(other);
        c.record_streams++;
      } else if (kind < 93) {
        const TaggedBlock& l = live[rng() % live.size()];
        const int where = rng() % 3;
        const int owner = *a.DeviceOf(l.ptr);
        // Ordered on a stream of the owner, or of the target device.
        const Stream s = streams[where == 2 || rng() % 2 ? owner : where][rng() % 4];
        if (absl::Status st =
                a.Move(l.ptr, where == 2 ? Location::Host() : Location::Device(where), s);
            !st.ok()) {
          std::fprintf(stderr, "move: %s\n", st.ToString().c_str());
          c.failures++;
        }
        c.moves++;
      } else if (kind < 95) {
        AllocationHints h;
        h.read_mostly = rng() & 1;
        h.accessed_by = {static_cast<int>(rng() % 2)};
        if (absl::Status st = a.SetHints(live[rng() % live.size()].ptr, h); !st.ok()) {
          std::fprintf(stderr, "hints: %s\n", st.ToString().c_str());
          c.failures++;
        }
        c.hints++;
      } else if (kind < 99 || rng() % 50 != 0) {
        (void)backend.CompleteWork(streams[dev][rng() % 4]);  // the "GPU" makes progress
        c.progress++;
      } else {
        (void)a.EmptyCache();
        c.empty_caches++;
      }
      if (op % check_every == check_every - 1) {
        c.invariant_checks++;
        if (absl::Status st = a.CheckInvariants(); !st.ok()) {
          std::fprintf(stderr, "%s\n", st.ToString().c_str());
          c.failures++;
        }
      }
    }
    for (const TaggedBlock& l : live) {
      c.tag_checks++;
      if (!l.Intact() || !a.Free(l.ptr).ok()) c.failures++;
      c.frees++;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker, t);
  for (auto& t : pool) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  c.invariant_checks++;
  if (!a.CheckInvariants().ok()) c.failures++;
  const DeviceStats st = a.GetStats();
  if (st.allocation[kAllPools].current != 0) c.failures++;
  if (!a.EmptyCache().ok() || a.GetStats().reserved_bytes[kAllPools].current != 0) c.failures++;
  made->reset();
  for (auto& ss : streams) {
    for (Stream s : ss) (void)backend.DestroyStream(s);
  }
  const HostResourceCounts left = backend.LiveResources();
  const bool leak = left.managed_allocations != 0 || left.events != 0 || left.streams != 0;
  if (leak) c.failures++;
  const long ops = c.allocs + c.frees + c.ooms + c.rejected + c.record_streams + c.moves +
                   c.hints + c.progress + c.empty_caches;
  std::printf(
      "long_stress: %ld operations in %.1f s from %d threads on 8 streams / 2 devices\n"
      "  allocations %ld, frees %ld, out-of-memory %ld, rejected bad input %ld\n"
      "  record_stream %ld, moves %ld, hints %ld, stream progress %ld, empty_cache %ld\n"
      "  tag checks %ld, invariant checks %ld, cross-stream reuses %ld, OOM retries %ld\n"
      "  peak reserved %.1f MiB of 2 x 256 MiB; leaks: %s\n"
      "%ld passed, %ld failed\n",
      ops, seconds, threads, c.allocs.load(), c.frees.load(), c.ooms.load(), c.rejected.load(),
      c.record_streams.load(), c.moves.load(), c.hints.load(), c.progress.load(),
      c.empty_caches.load(), c.tag_checks.load(), c.invariant_checks.load(),
      static_cast<long>(st.num_cross_stream_reuse), static_cast<long>(st.num_alloc_retries),
      st.reserved_bytes[kAllPools].peak / 1048576.0, leak ? "YES" : "none",
      c.failures == 0 ? 1L : 0L, c.failures == 0 ? 0L : 1L);
  return c.failures == 0 && ops >= total / threads * threads ? 0 : 1;
}

}  // namespace
}  // namespace cma

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cma::Main();
}
