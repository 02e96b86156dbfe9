#include "allocator/chunk_pinner.h"

#include <algorithm>
#include <utility>

namespace cma {

ChunkPinner::ChunkPinner(Backend& backend, std::vector<std::size_t> sizes, unsigned threads)
    : backend_(backend), sizes_(std::move(sizes)) {
  results_.assign(sizes_.size(), absl::UnknownError("not pinned"));
  done_.assign(sizes_.size(), 0);
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, sizes_.size()));
  for (unsigned t = 0; t < threads; ++t) workers_.emplace_back([this] { Work(); });
}

ChunkPinner::~ChunkPinner() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
  std::lock_guard<std::mutex> l(mu_);
  for (std::size_t i = next_take_; i < sizes_.size(); ++i) {
    if (done_[i] && results_[i].ok()) {
      // Never handed out: nothing can use it. A failure to free leaks it
      // (the backend keeps it pinned); there is no one to tell.
      backend_.FreePinnedHost(*results_[i]).IgnoreError();
    }
  }
}

void ChunkPinner::Work() {
  for (;;) {
    std::size_t i;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (stopping_ || next_start_ == sizes_.size()) return;
      i = next_start_++;
    }
    absl::StatusOr<void*> p = backend_.AllocatePinnedHost(sizes_[i]);
    {
      std::lock_guard<std::mutex> l(mu_);
      results_[i] = std::move(p);
      done_[i] = 1;
    }
    ready_.notify_all();
  }
}

absl::StatusOr<ChunkPinner::Chunk> ChunkPinner::Next() {
  if (next_take_ == sizes_.size()) return absl::OutOfRangeError("ChunkPinner: no chunk left");
  const std::size_t i = next_take_++;
  if (workers_.empty()) {
    absl::StatusOr<void*> p = backend_.AllocatePinnedHost(sizes_[i]);
    if (!p.ok()) return p.status();
    return Chunk{*p, sizes_[i]};
  }
  std::unique_lock<std::mutex> l(mu_);
  ready_.wait(l, [&] { return done_[i] != 0; });
  if (!results_[i].ok()) return results_[i].status();
  return Chunk{*results_[i], sizes_[i]};
}

unsigned ChunkPinner::ThreadsFor(std::size_t chunks, int most) {
  if (chunks <= 1 || most <= 1) return 0;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(
      std::min<std::size_t>({static_cast<std::size_t>(most), cores, chunks}));
}

}  // namespace cma
