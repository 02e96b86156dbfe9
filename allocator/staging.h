// Sleep levels and the pinned host staging area a Sleep copies kept
// contents into (allocator/sleep.cc carries them out).
//
// Why staging: a managed prefetch to the host is capped by the host's page
// population (every sleep populates fresh host pages, every wake frees
// them), while a copy engine writing into page-locked memory that outlives
// the cycle runs at the link's speed. So a Sleep copies each kept
// allocation's bytes into the staging area (adjacent allocations in one
// copy; the area holds no more than those bytes) and discards their 2 MiB
// pages on the device; Wake populates them again and copies back. Same
// addresses throughout; bytes on a page that must stay (one shared with an
// allocation that stays: allocator/sleep_plan.h) migrate instead.
//
// Internal to allocator/; guarded by the owning DeviceAllocator's mutex.
// Ownership: the area owns its chunks until Release (the backend frees
// them); the owner must Release before the backend goes.
#ifndef CMA_ALLOCATOR_STAGING_H_
#define CMA_ALLOCATOR_STAGING_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "backends/backend.h"

namespace cma {

// vLLM's sleep levels, plus the migrating path this library had first.
enum class SleepLevel {
  // Every allocation's pages migrate to the host (a prefetch); contents stay
  // readable from the host while asleep. Disposable ones are discarded.
  kMigrate = 0,
  // vLLM's level 1: every allocation not marked disposable keeps its
  // contents through pinned host staging (migrating where staging is off,
  // full or unavailable); disposable ones are discarded.
  kOffload = 1,
  // vLLM's level 2: only allocations marked keep (SetKeep) keep their
  // contents; everything else is discarded (the user reloads it).
  kDiscard = 2,
};

// A linear space of staging bytes over page-locked host chunks. Offsets are
// handed out from the start (Take) and all given back at once (Reset) when
// nothing staged is left; chunks stay across cycles until Release.
class StagingArea {
 public:
  std::size_t capacity() const { return capacity_; }
  std::size_t used() const { return used_; }
  // Reserves `bytes` at the end of the used space; returns its offset. The
  // caller has checked that it fits the configured bound (not the capacity:
  // Grow follows).
  std::size_t Take(std::size_t bytes) {
    const std::size_t at = used_;
    used_ += bytes;
    return at;
  }
  void Reset() { used_ = 0; }
  // Gives back the last `bytes` taken (a plan that fell back to migrating).
  void Untake(std::size_t bytes) { used_ -= bytes; }
  // Takes ownership of `bytes` of pinned host memory (AllocatePinnedHost's)
  // as the area's next chunk.
  void Adopt(void* base, std::size_t bytes) {
    chunks_.push_back({static_cast<char*>(base), bytes});
    capacity_ += bytes;
  }
  // Appends the copies between [offset, offset + bytes) of the staging space
  // and `managed` (to the staging with `to_staging`, else back), split at
  // chunk boundaries. With `merge`, a copy that continues the last one in
  // both address spaces extends it instead, within one chunk only: chunks
  // are separate pinned buffers even where the host placed them back to
  // back, and a copy across two is refused by the driver (which is how every
  // sleep of some processes once fell back to migrating). The range must lie
  // within capacity().
  void AppendCopies(std::size_t offset, void* managed, std::size_t bytes, bool to_staging,
                    std::vector<Copy>* out, bool merge = false) const {
    std::size_t base = 0;
    char* m = static_cast<char*>(managed);
    for (const Chunk& c : chunks_) {
      if (bytes == 0) return;
      if (offset < base + c.bytes) {
        const std::size_t in = offset - base;
        const std::size_t n = c.bytes - in < bytes ? c.bytes - in : bytes;
        const Copy copy = to_staging ? Copy{c.base + in, m, n} : Copy{m, c.base + in, n};
        if (merge && in != 0 && !out->empty() && Continues(out->back(), copy)) {
          out->back().bytes += n;
        } else {
          out->push_back(copy);
        }
        m += n;
        offset += n;
        bytes -= n;
      }
      base += c.bytes;
    }
  }
  // Frees every chunk (the caller has ordered the host after the copies
  // that use them). Chunks that fail to free are kept and the first error
  // returned.
  absl::Status Release(Backend& backend) {
    absl::Status first;
    std::vector<Chunk> kept;
    for (const Chunk& c : chunks_) {
      absl::Status s = backend.FreePinnedHost(c.base);
      if (!s.ok()) {
        if (first.ok()) first = s;
        kept.push_back(c);
        continue;
      }
      capacity_ -= c.bytes;
    }
    chunks_ = std::move(kept);
    if (chunks_.empty()) used_ = 0;
    return first;
  }

 private:
  static bool Continues(const Copy& last, const Copy& next) {
    return static_cast<char*>(last.dst) + last.bytes == next.dst &&
           static_cast<const char*>(last.src) + last.bytes == next.src;
  }
  struct Chunk {
    char* base;
    std::size_t bytes;
  };
  std::vector<Chunk> chunks_;
  std::size_t capacity_ = 0;
  std::size_t used_ = 0;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_STAGING_H_
