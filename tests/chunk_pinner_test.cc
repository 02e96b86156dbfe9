// ChunkPinner (allocator/chunk_pinner.h) on the host backend: chunks come
// back in order whatever order the workers finish in, a failed chunk stops
// the caller there, and nothing pinned but not taken outlives the pinner.
#include "allocator/chunk_pinner.h"

#include <memory>
#include <vector>

#include "backends/host/host_backend.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::unique_ptr<HostBackend> Host(std::size_t pinned_capacity = std::size_t{1} << 30) {
  HostBackendOptions o;
  o.pinned_capacity = pinned_capacity;
  return std::make_unique<HostBackend>(o);
}

std::size_t Pinned(HostBackend& b) { return b.LiveResources().pinned_bytes; }

class ChunkPinnerTest : public ::testing::TestWithParam<unsigned> {};

TEST_P(ChunkPinnerTest, HandsOutEveryChunkInOrder) {
  auto backend = Host();
  const std::vector<std::size_t> sizes = {2 * kMiB, 4 * kMiB, 2 * kMiB, 6 * kMiB, 2 * kMiB};
  std::vector<void*> taken;
  {
    ChunkPinner pinner(*backend, sizes, GetParam());
    for (std::size_t want : sizes) {
      absl::StatusOr<ChunkPinner::Chunk> c = pinner.Next();
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ(c->bytes, want);
      taken.push_back(c->base);
    }
    EXPECT_FALSE(pinner.Next().ok()) << "a chunk past the last";
  }
  EXPECT_EQ(Pinned(*backend), 16 * kMiB) << "the caller owns every chunk it took";
  for (void* p : taken) ASSERT_TRUE(backend->FreePinnedHost(p).ok());
}

TEST_P(ChunkPinnerTest, AFailedChunkStopsTheCallerAndNothingUntakenStays) {
  auto backend = Host(8 * kMiB);  // room for two of the four chunks
  std::vector<void*> taken;
  {
    ChunkPinner pinner(*backend, {4 * kMiB, 4 * kMiB, 4 * kMiB, 4 * kMiB}, GetParam());
    for (;;) {
      absl::StatusOr<ChunkPinner::Chunk> c = pinner.Next();
      if (!c.ok()) {
        EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted) << c.status();
        break;
      }
      taken.push_back(c->base);
    }
    EXPECT_LE(taken.size(), 2u);
  }
  EXPECT_EQ(Pinned(*backend), taken.size() * 4 * kMiB) << "a chunk pinned past the failure leaked";
  for (void* p : taken) ASSERT_TRUE(backend->FreePinnedHost(p).ok());
}

TEST_P(ChunkPinnerTest, ChunksNeverTakenAreFreed) {
  auto backend = Host();
  {
    ChunkPinner pinner(*backend, {2 * kMiB, 2 * kMiB, 2 * kMiB}, GetParam());
    absl::StatusOr<ChunkPinner::Chunk> first = pinner.Next();  // taken: the caller frees it
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE(backend->FreePinnedHost(first->base).ok());
  }
  EXPECT_EQ(Pinned(*backend), 0u);
}

INSTANTIATE_TEST_SUITE_P(Threads, ChunkPinnerTest, ::testing::Values(0u, 1u, 3u, 8u));

TEST(ChunkPinnerThreads, AtMostEightAndNoneForOneChunk) {
  EXPECT_EQ(ChunkPinner::ThreadsFor(0), 0u);
  EXPECT_EQ(ChunkPinner::ThreadsFor(1), 0u);
  EXPECT_GE(ChunkPinner::ThreadsFor(2), 1u);
  EXPECT_LE(ChunkPinner::ThreadsFor(2), 2u);
  EXPECT_LE(ChunkPinner::ThreadsFor(100), 8u);
  EXPECT_EQ(ChunkPinner::ThreadsFor(100, 1), 0u) << "sleep_pin_threads:1 pins on the caller";
  EXPECT_LE(ChunkPinner::ThreadsFor(100, 64), 64u);
}

}  // namespace
}  // namespace cma
