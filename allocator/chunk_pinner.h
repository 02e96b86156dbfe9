// Pins a first Sleep's staging chunks on several threads at once.
//
// Pinning fresh host memory is what makes a first Sleep slow: the kernel
// populates and zeroes every page, then the driver locks and maps them.
// One chunk after another (256 MiB each, its pages touched by 16 threads)
// pinned 5 GB at 22.4 GB/s on an H200 host; 8 threads each pinning their own
// chunks reached 28.1 GB/s (the sleep phases experiment's PinWays:
// bench/results/README.md, Settled experiments). The pinner starts that
// work for every chunk a Sleep will need and hands the chunks out in order
// as each is ready, so the Sleep queues the copies into one chunk while the
// next ones are still being pinned.
//
// Thread safety: one owner thread calls Next; the workers only call the
// backend's AllocatePinnedHost and FreePinnedHost (thread-safe by the
// Backend contract) and touch no allocator state. Ownership: a chunk Next
// returned is the caller's; the destructor stops the workers (no chunk is
// started after it begins) and frees every chunk pinned but not taken.
// Errors: Next returns the backend's error for that chunk; the caller
// stops taking chunks there.
#ifndef CMA_ALLOCATOR_CHUNK_PINNER_H_
#define CMA_ALLOCATOR_CHUNK_PINNER_H_

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"

namespace cma {

class ChunkPinner {
 public:
  // Pins chunks of `sizes` bytes, in that order, on up to `threads`
  // workers (none: each is pinned inside Next, on the caller's thread).
  ChunkPinner(Backend& backend, std::vector<std::size_t> sizes, unsigned threads);
  ~ChunkPinner();
  ChunkPinner(const ChunkPinner&) = delete;
  ChunkPinner& operator=(const ChunkPinner&) = delete;

  // The next chunk in order (waiting until it is pinned), and its size.
  struct Chunk {
    void* base;
    std::size_t bytes;
  };
  absl::StatusOr<Chunk> Next();

  // Workers a Sleep uses for `chunks` chunks: up to `most` (the config's
  // sleep_pin_threads), no more than the host's cores or the chunks; 0 (the
  // caller's thread) for one chunk, or when `most` is 1.
  static unsigned ThreadsFor(std::size_t chunks, int most = 8);

 private:
  void Work();

  Backend& backend_;
  const std::vector<std::size_t> sizes_;
  std::vector<std::thread> workers_;
  // A standard mutex and condition variable, not absl::Mutex::Await:
  // ThreadSanitizer cannot see Debian's Abseil wait (backends/mutex_lock.h).
  std::mutex mu_;
  std::condition_variable ready_;
  // Guarded by mu_:
  std::size_t next_start_ = 0;  // the next chunk a worker pins
  bool stopping_ = false;
  std::vector<absl::StatusOr<void*>> results_;
  std::vector<char> done_;
  // The owner's only:
  std::size_t next_take_ = 0;  // the next chunk Next returns
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_CHUNK_PINNER_H_
