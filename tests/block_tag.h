// A tag written at both ends of a live block and checked before it is freed:
// two callers handed overlapping memory would overwrite each other's tags.
#ifndef CMA_TESTS_BLOCK_TAG_H_
#define CMA_TESTS_BLOCK_TAG_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cma {

struct TaggedBlock {
  void* ptr;
  std::size_t bytes;  // at least 16
  std::uint64_t tag;

  void Write() const {
    std::memcpy(ptr, &tag, sizeof(tag));
    std::memcpy(static_cast<char*>(ptr) + bytes - sizeof(tag), &tag, sizeof(tag));
  }
  bool Intact() const {
    std::uint64_t a, b;
    std::memcpy(&a, ptr, sizeof(a));
    std::memcpy(&b, static_cast<char*>(ptr) + bytes - sizeof(b), sizeof(b));
    return a == tag && b == tag;
  }
};

}  // namespace cma

#endif  // CMA_TESTS_BLOCK_TAG_H_
