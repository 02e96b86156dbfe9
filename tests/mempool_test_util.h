// The fixture of the private-pool tests: a one-GiB host device (or several)
// with two manually completed streams, a filter taking one stream, and a
// count of the backend calls that would break a CUDA graph capture.
#ifndef CMA_TESTS_MEMPOOL_TEST_UTIL_H_
#define CMA_TESTS_MEMPOOL_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>

#include "tests/test_util.h"

namespace cma {

class MemPoolFixture : public AllocatorTest {
 protected:
  void SetUp() override { Remake(""); }
  void Remake(const std::string& config, int devices = 1) {
    Make({.device_count = devices, .device_capacity = std::size_t{1} << 30,
          .manual_completion = true},
         config);
    s1_ = *backend_->CreateStream(0);
    s2_ = *backend_->CreateStream(0);
  }
  void TearDown() override {
    for (Stream s : {s1_, s2_}) ASSERT_TRUE(backend_->CompleteWork(s).ok());
    AllocatorTest::TearDown();
  }
  static StreamFilter Only(Stream s) {
    return [s](Stream t) { return t == s; };
  }
  // A context PyTorch's use_mem_pool would begin (PoolContextOptions::not_a_capture).
  void BeginNotACapture(MemPoolId id, StreamFilter filter = nullptr) {
    PoolContextOptions options;
    options.not_a_capture = true;
    ASSERT_TRUE(alloc_->BeginAllocateToPool(0, id, std::move(filter), options).ok());
  }
  std::int64_t Reserved() { return Stats().reserved_bytes[kAllPools].current; }
  // Calls that would break a CUDA graph capture.
  std::int64_t UncapturableCalls() {
    std::int64_t n = 0;
    for (const char* m : {"QueryStream", "QueryEvent", "RecordEvent", "SynchronizeStream",
                          "SynchronizeEvent", "StreamWaitEvent", "Prefetch", "PrefetchBatch",
                          "DiscardBatch", "DiscardAndPrefetchBatch", "Advise", "FreeManaged"}) {
      n += backend_->CallCount(m);
    }
    return n;
  }
  Stream s1_ = 0, s2_ = 0;
};

}  // namespace cma

#endif  // CMA_TESTS_MEMPOOL_TEST_UTIL_H_
