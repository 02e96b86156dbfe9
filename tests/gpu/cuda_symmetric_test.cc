// Symmetric mode on real GPUs (needs two): peer writes by kernels through
// symmetric pointers are visible, with two devices in one process and with
// two processes of one device each (skipped with the reason on fewer GPUs);
// and, on one GPU, fabric handles or their fallback.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "allocator/symmetric/exchange.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/nvshmem_api.h"
#include "bench/cuda/kernels.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

constexpr std::size_t kBytes = std::size_t{64} << 20;

// Counts words of `p` (on `device`) that differ from the pattern `seed`.
unsigned long long Mismatches(Backend& b, const void* p, std::uint32_t seed, int device) {
  cudaSetDevice(device);
  unsigned long long* bad = nullptr;
  if (cudaMallocManaged(reinterpret_cast<void**>(&bad), sizeof(*bad)) != cudaSuccess) return ~0ull;
  *bad = 0;
  Stream s = *b.CreateStream(device);
  unsigned long long out = ~0ull;
  if (LaunchCheck(p, kBytes, seed, bad, s).ok() && b.SynchronizeStream(s).ok()) out = *bad;
  (void)b.DestroyStream(s);
  cudaFree(bad);
  return out;
}

// The child side of TwoProcessesOneDeviceEach, run in a fresh process.
int ChildMain(int rank, const std::string& path) {
  // This process's GPU, as a program of one GPU per process makes it (the
  // Put's source buffer below is cudaMalloc'ed on the current device).
  if (cudaSetDevice(rank) != cudaSuccess) return 16;
  auto backend = MakeCudaBackend();
  if (!backend.ok()) return 2;
  const char* token = std::getenv("CMA_SYMMETRIC_CHILD_TOKEN");
  if (token == nullptr) return 5;
  auto x = MakeUnixSocketExchange(path, rank, 2, absl::Seconds(60), token);
  if (!x.ok()) return 3;
  SymmetricGroup g;
  g.world_size = 2;
  g.local_ranks = {rank};
  g.local_devices = {rank};
  SymmetricOptions o;
  const char* provider = std::getenv("CMA_SYMMETRIC_CHILD_PROVIDER");
  const bool shmem = provider != nullptr && std::string(provider) == "nvshmem";
  if (shmem) o.provider = SymmetricProvider::kNvshmem;
  auto heap = SymmetricHeap::Create(**backend, g, std::move(*x), o);
  if (!heap.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, std::string(heap.status().message()).c_str());
    return 4;
  }
  auto a = (*heap)->Allocate(kBytes);
  if (!a.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, std::string(a.status().message()).c_str());
    return 5;
  }
  Stream s = *(*backend)->CreateStream(rank);
  const int peer = 1 - rank;
  // Write the peer's buffer from this device, over the peer mapping (for
  // NVSHMEM, nvshmem_ptr's, where the peer is reachable by load/store).
  if ((*a)->peers[peer] != nullptr && !LaunchFill((*a)->peers[peer], kBytes, 100 + rank, s).ok()) {
    return 6;
  }
  if (shmem) {
    // And through Put: the same pattern from a local buffer (a direct copy
    // where mapped, NVSHMEM's putmem_on_stream where not).
    void* local = nullptr;
    if (cudaMalloc(&local, kBytes) != cudaSuccess) return 11;
    if (!LaunchFill(local, kBytes, 100 + rank, s).ok()) return 12;
    absl::Status put = (*heap)->Put(*a, peer, 0, local, kBytes, s);
    if (!put.ok()) {
      fprintf(stderr, "rank %d: %s\n", rank, std::string(put.message()).c_str());
      return 13;
    }
    if (!(*backend)->SynchronizeStream(s).ok()) return 14;
    cudaFree(local);
  } else if ((*a)->peers[peer] == nullptr) {
    return 6;
  }
  if (!(*backend)->SynchronizeStream(s).ok()) return 7;
  if (!(*heap)->EmptyCache().ok()) return 8;  // collective: both have written
  const unsigned long long bad = Mismatches(**backend, (*a)->peers[rank], 100 + peer, rank);
  (void)(*backend)->DestroyStream(s);
  if (bad != 0) return 9;
  if (!(*heap)->Free(*a).ok()) return 10;
  if (shmem && !(*heap)->EmptyCache().ok()) return 15;  // NVSHMEM's memory back, together
  return 0;
}

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST(CudaSymmetricTest, TwoDevicesInOneProcess) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two GPUs (" << GpuCount() << " visible)";
  auto backend = MakeCudaBackend();
  ASSERT_TRUE(backend.ok());
  SymmetricGroup g;
  g.world_size = 2;
  g.local_ranks = {0, 1};
  g.local_devices = {0, 1};
  auto heap = SymmetricHeap::Create(**backend, g, MakeSingleProcessExchange());
  ASSERT_TRUE(heap.ok()) << heap.status();
  auto a = (*heap)->Allocate(kBytes);
  ASSERT_TRUE(a.ok()) << a.status();
  Stream s0 = *(*backend)->CreateStream(0), s1 = *(*backend)->CreateStream(1);
  ASSERT_TRUE(LaunchFill((*a)->peers[1], kBytes, 11, s0).ok());  // device 0 writes member 1
  ASSERT_TRUE(LaunchFill((*a)->peers[0], kBytes, 22, s1).ok());  // device 1 writes member 0
  ASSERT_TRUE((*backend)->SynchronizeStream(s0).ok());
  ASSERT_TRUE((*backend)->SynchronizeStream(s1).ok());
  EXPECT_EQ(Mismatches(**backend, (*a)->peers[1], 11, 1), 0u);
  EXPECT_EQ(Mismatches(**backend, (*a)->peers[0], 22, 0), 0u);
  // Kernels find the same pointers in the device-side table.
  EXPECT_EQ(static_cast<void**>((*a)->device_peers)[1], (*a)->peers[1]);
  ASSERT_TRUE((*heap)->Free(*a).ok());
  auto again = (*heap)->Allocate(kBytes);  // cached: no driver call
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*heap)->GetStats().cache_hits, 1);
  ASSERT_TRUE((*heap)->Free(*again).ok());
  (void)(*backend)->DestroyStream(s0);
  (void)(*backend)->DestroyStream(s1);
}

// One GPU is enough: fabric handles are probed at create. Where the probe
// fails (no IMEX channel, or no fabric support), the heap without fallback
// is refused naming device 0 and the one with fallback uses POSIX FDs;
// where it passes, both export fabric handles. Either way the memory works.
TEST(CudaSymmetricTest, FabricHandlesOrTheirFallbackOnThisMachine) {
  if (GpuCount() < 1) GTEST_SKIP() << "needs a GPU";
  auto backend = MakeCudaBackend();
  ASSERT_TRUE(backend.ok());
  SymmetricGroup g{1, {0}, {0}};
  SymmetricOptions fabric;
  fabric.handle_type = HandleType::kFabric;
  SymmetricOptions fallback = fabric;
  fallback.fabric_fallback = true;
  auto heap = SymmetricHeap::Create(**backend, g, MakeSingleProcessExchange(), fallback);
  ASSERT_TRUE(heap.ok()) << heap.status();
  const bool fell_back = (*heap)->handle_type() == HandleType::kPosixFd;
  printf("fabric handles on this machine: %s%s\n", fell_back ? "no, POSIX FDs: " : "yes",
         (*heap)->handle_fallback_reason().c_str());
  EXPECT_EQ(fell_back, !(*heap)->handle_fallback_reason().empty());
  auto strict = SymmetricHeap::Create(**backend, g, MakeSingleProcessExchange(), fabric);
  EXPECT_EQ(strict.ok(), !fell_back) << strict.status();
  if (!strict.ok()) {
    EXPECT_EQ(strict.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(std::string(strict.status().message()).find("device 0"), std::string::npos);
  }
  auto a = (*heap)->Allocate(kBytes);
  ASSERT_TRUE(a.ok()) << a.status();
  Stream s = *(*backend)->CreateStream(0);
  ASSERT_TRUE(LaunchFill((*a)->peers[0], kBytes, 33, s).ok());
  ASSERT_TRUE((*backend)->SynchronizeStream(s).ok());
  EXPECT_EQ(Mismatches(**backend, (*a)->peers[0], 33, 0), 0u);
  (void)(*backend)->DestroyStream(s);
  ASSERT_TRUE((*heap)->Free(*a).ok());
}

// Two processes, one GPU each: the VMM provider, or NVSHMEM's.
void RunTwoProcesses(const char* provider) {
  const std::string path = absl::StrFormat("/tmp/cma-gpu-sym-%s-%d.sock", provider, getpid());
  const std::string token = *MakeRendezvousToken();
  pid_t pids[2];
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    if (pids[r] == 0) {
      // A fresh image, so the child's CUDA state starts clean.
      const std::string rank = std::to_string(r);
      setenv("CMA_SYMMETRIC_CHILD_RANK", rank.c_str(), 1);
      setenv("CMA_SYMMETRIC_CHILD_PATH", path.c_str(), 1);
      setenv("CMA_SYMMETRIC_CHILD_TOKEN", token.c_str(), 1);
      setenv("CMA_SYMMETRIC_CHILD_PROVIDER", provider, 1);
      execl("/proc/self/exe", "cuda_symmetric_test", nullptr);
      _exit(127);
    }
  }
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    EXPECT_TRUE(WIFEXITED(status)) << "rank " << r;
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << r << " failed (see its exit code in the test)";
  }
}

TEST(CudaSymmetricTest, TwoProcessesOneDeviceEach) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two GPUs (" << GpuCount() << " visible)";
  RunTwoProcesses("vmm");
}

// NVSHMEM initialised through the heap's exchange, kernels writing through
// nvshmem_ptr's pointers, Put, and EmptyCache freeing together. Skipped with
// the reason where NVSHMEM's host library cannot be loaded.
TEST(CudaSymmetricTest, TwoProcessesOneDeviceEachOnNvshmem) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs two GPUs (" << GpuCount() << " visible)";
  absl::StatusOr<const NvshmemApi*> api = NvshmemApi::Get();
  if (!api.ok()) GTEST_SKIP() << api.status().message();
  RunTwoProcesses("nvshmem");
}

}  // namespace
}  // namespace cma

int main(int argc, char** argv) {
  if (const char* rank = std::getenv("CMA_SYMMETRIC_CHILD_RANK")) {
    return cma::ChildMain(std::atoi(rank), std::getenv("CMA_SYMMETRIC_CHILD_PATH"));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
