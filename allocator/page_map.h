// PageMap: the physical state of one arena's kPageSize pages.
//
// Populated pages are a bitmap, so that counting them over a block of any
// size is a few popcounts. Use is counted only at a block's edges: a page
// strictly inside a block lies in no other block, so whether it is in use is
// that block's state, and handing out or freeing a large block touches two
// counters, not one per page. edge_users(p) is the number of blocks that are
// not free (allocated, or freed but awaiting other streams) whose first or
// last page is p.
//
// Each populated page also records whether a small request (PyTorch's size
// class, at most 1 MiB) populated it, so that reserved_bytes.small_pool and
// .large_pool split an arena's pages as PyTorch's small and large segments
// split its memory.
//
// Internal to allocator/; guarded by the owning DeviceAllocator's mutex.
#ifndef CMA_ALLOCATOR_PAGE_MAP_H_
#define CMA_ALLOCATOR_PAGE_MAP_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace cma {

class PageMap {
 public:
  PageMap() = default;
  explicit PageMap(std::size_t pages)
      : pages_(pages),
        bits_((pages + 63) / 64, 0),
        small_bits_((pages + 63) / 64, 0),
        edge_users_(pages, 0) {}

  std::size_t size() const { return pages_; }
  std::size_t populated_count() const { return populated_; }
  std::size_t small_count() const { return small_; }
  bool populated(std::size_t p) const { return (bits_[p / 64] >> (p % 64)) & 1; }
  // Whether a small request populated page p (false when not populated).
  bool small(std::size_t p) const { return (small_bits_[p / 64] >> (p % 64)) & 1; }
  void set_populated(std::size_t p, bool by_small = false) {
    if (populated(p)) return;
    ++populated_;
    bits_[p / 64] |= std::uint64_t{1} << (p % 64);
    if (by_small) {
      ++small_;
      small_bits_[p / 64] |= std::uint64_t{1} << (p % 64);
    }
  }
  void clear_populated(std::size_t p) {
    if (!populated(p)) return;
    --populated_;
    bits_[p / 64] &= ~(std::uint64_t{1} << (p % 64));
    if (small(p)) {
      --small_;
      small_bits_[p / 64] &= ~(std::uint64_t{1} << (p % 64));
    }
  }
  // Populated pages in [lo, hi).
  std::size_t CountPopulated(std::size_t lo, std::size_t hi) const {
    std::size_t n = 0;
    while (lo < hi) {
      const std::size_t word = lo / 64, bit = lo % 64;
      const std::size_t span = std::min<std::size_t>(64 - bit, hi - lo);
      const std::uint64_t mask = span == 64 ? ~std::uint64_t{0}
                                            : ((std::uint64_t{1} << span) - 1) << bit;
      const std::uint64_t set = bits_[word] & mask;
      // All set is the steady state; a real popcount only otherwise (it is
      // a library call on baseline x86-64).
      n += set == mask ? span : static_cast<std::size_t>(__builtin_popcountll(set));
      lo += span;
    }
    return n;
  }
  // One past the last populated page in [lo, hi), or lo if none is.
  std::size_t PopulatedEnd(std::size_t lo, std::size_t hi) const {
    while (hi > lo) {
      const std::size_t p = hi - 1;
      const std::uint64_t word = bits_[p / 64];
      if (word == 0 && p % 64 == 63 && p >= lo + 63) {
        hi -= 64;  // a whole empty word
        continue;
      }
      if ((word >> (p % 64)) & 1) return hi;
      --hi;
    }
    return lo;
  }
  std::uint32_t& edge_users(std::size_t p) { return edge_users_[p]; }
  std::uint32_t edge_users(std::size_t p) const { return edge_users_[p]; }

 private:
  std::size_t pages_ = 0;
  std::size_t populated_ = 0;
  std::size_t small_ = 0;
  std::vector<std::uint64_t> bits_;
  std::vector<std::uint64_t> small_bits_;
  std::vector<std::uint32_t> edge_users_;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_PAGE_MAP_H_
