// PageMap's populated-page queries, against a plain per-page model.
#include <random>
#include <vector>

#include "allocator/page_map.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

TEST(PageMapTest, PopulatedEndFindsTheLastPopulatedPageAcrossWords) {
  PageMap m(300);
  EXPECT_EQ(m.PopulatedEnd(0, 300), 0u);  // none: lo
  EXPECT_EQ(m.PopulatedEnd(17, 250), 17u);
  m.set_populated(3);
  m.set_populated(130);
  EXPECT_EQ(m.PopulatedEnd(0, 300), 131u);  // skips the empty words above
  EXPECT_EQ(m.PopulatedEnd(0, 130), 4u);
  EXPECT_EQ(m.PopulatedEnd(4, 130), 4u);
  EXPECT_EQ(m.PopulatedEnd(130, 131), 131u);
  m.clear_populated(130);
  EXPECT_EQ(m.PopulatedEnd(0, 300), 4u);
}

TEST(PageMapTest, PopulatedEndAndCountMatchAModelOnRandomMaps) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 200; ++round) {
    const std::size_t pages = 1 + rng() % 400;
    PageMap m(pages);
    std::vector<bool> model(pages, false);
    const int sets = static_cast<int>(rng() % 6);  // sparse, so that words are empty
    for (int i = 0; i < sets; ++i) {
      const std::size_t p = rng() % pages;
      m.set_populated(p);
      model[p] = true;
    }
    for (int q = 0; q < 50; ++q) {
      std::size_t lo = rng() % (pages + 1), hi = rng() % (pages + 1);
      if (lo > hi) std::swap(lo, hi);
      std::size_t end = lo, count = 0;
      for (std::size_t p = lo; p < hi; ++p) {
        if (model[p]) {
          end = p + 1;
          ++count;
        }
      }
      ASSERT_EQ(m.PopulatedEnd(lo, hi), end) << "pages " << pages << " [" << lo << ", " << hi << ")";
      ASSERT_EQ(m.CountPopulated(lo, hi), count);
    }
  }
}

}  // namespace
}  // namespace cma
