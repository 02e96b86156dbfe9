// A SegmentSource for the tests of pools of another allocator
// (allocator/segment_source.h): host memory, every call logged, failures on
// demand.
#ifndef CMA_TESTS_SEGMENT_SOURCE_TEST_UTIL_H_
#define CMA_TESTS_SEGMENT_SOURCE_TEST_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "allocator/segment_source.h"
#include "gtest/gtest.h"

namespace cma {

// Host memory handed out as "another allocator's": every call is logged.
struct SourceLog {
  std::vector<std::size_t> allocs;  // sizes asked for
  std::vector<std::size_t> frees;
  std::map<std::uintptr_t, std::size_t> live;
  bool fail_alloc = false;  // out of memory
  bool fail_free = false;
  bool destroyed = false;
};

class FakeSource final : public SegmentSource {
 public:
  explicit FakeSource(SourceLog* log) : log_(log) {}
  ~FakeSource() override { log_->destroyed = true; }
  absl::StatusOr<void*> Allocate(int, std::size_t bytes, Stream) override {
    if (log_->fail_alloc) return absl::ResourceExhaustedError("fake allocator: out of memory");
    void* p = std::aligned_alloc(4096, bytes);
    log_->allocs.push_back(bytes);
    log_->live[reinterpret_cast<std::uintptr_t>(p)] = bytes;
    return p;
  }
  absl::Status Free(int, void* ptr, std::size_t bytes) override {
    if (log_->fail_free) return absl::InternalError("fake allocator: refused");
    auto it = log_->live.find(reinterpret_cast<std::uintptr_t>(ptr));
    EXPECT_NE(it, log_->live.end());
    if (it == log_->live.end()) return absl::InternalError("not ours");
    EXPECT_EQ(it->second, bytes);
    log_->live.erase(it);
    log_->frees.push_back(bytes);
    std::free(ptr);
    return absl::OkStatus();
  }

 private:
  SourceLog* log_;
};

// Whether [p, p + n) lies inside one segment `log` has handed out.
inline bool InSourceMemory(const SourceLog& log, const void* p, std::size_t n = 1) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = log.live.upper_bound(a);
  if (it == log.live.begin()) return false;
  --it;
  return a + n <= it->first + it->second;
}

}  // namespace cma

#endif  // CMA_TESTS_SEGMENT_SOURCE_TEST_UTIL_H_
