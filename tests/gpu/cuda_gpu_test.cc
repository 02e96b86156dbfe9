// GPU-only tests: real kernels on real streams. Without a visible CUDA device
// every test skips with the runtime's reason, so CI stays green.
//
// CMA_GPU_TEST_BACKEND=hip runs the same tests on the HIP backend, whose
// streams are CUDA streams only when its runtime is hip_on_cuda's
// libamdhip64.so (CMA_HIP_LIBRARY): the kernels are launched on them.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "allocator/caching_managed_allocator.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/registry.h"
#include "bench/cuda/kernels.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cma {
namespace {

using ::testing::HasSubstr;

constexpr long long kLongSpin = 200'000'000;  // ~0.1 s at H100/H200 clocks

class CudaGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* which = std::getenv("CMA_GPU_TEST_BACKEND");
    auto b = which != nullptr ? MakeBackend(which) : MakeCudaBackend();
    if (!b.ok()) GTEST_SKIP() << "no GPU: " << b.status();
    backend_ = std::move(*b);
    auto a = CachingManagedAllocator::Create(*backend_, "release_before_peak:0");
    ASSERT_TRUE(a.ok()) << a.status();
    alloc_ = std::move(*a);
    s1_ = *backend_->CreateStream(0);
    s2_ = *backend_->CreateStream(0);
    ASSERT_EQ(cudaMallocManaged(reinterpret_cast<void**>(&mismatches_), sizeof(*mismatches_)), cudaSuccess);
    *mismatches_ = 0;
  }
  void TearDown() override {
    if (!backend_) return;
    EXPECT_TRUE(backend_->SynchronizeStream(s1_).ok());
    EXPECT_TRUE(backend_->SynchronizeStream(s2_).ok());
    EXPECT_TRUE(alloc_->CheckInvariants().ok()) << alloc_->CheckInvariants();
    alloc_.reset();
    cudaFree(mismatches_);
    EXPECT_TRUE(backend_->DestroyStream(s1_).ok());
    EXPECT_TRUE(backend_->DestroyStream(s2_).ok());
  }
  unsigned long long Mismatches(Stream s) {
    EXPECT_TRUE(backend_->SynchronizeStream(s).ok());
    return *mismatches_;
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<CachingManagedAllocator> alloc_;
  Stream s1_ = 0, s2_ = 0;
  unsigned long long* mismatches_ = nullptr;
};

TEST_F(CudaGpuTest, KernelStillWritingOnS1IsNeverHandedToS2) {
  // Classic segments: 12 MiB from a 20 MiB segment, the 8 MiB left cannot
  // serve a second one.
  alloc_ = *CachingManagedAllocator::Create(*backend_, "segments:classic");
  constexpr std::size_t kBytes = 12 << 20;
  void* p = *alloc_->Allocate(kBytes, 0, s1_);
  // A long kernel, then a fill: both queued on s1 when the host frees p.
  ASSERT_TRUE(LaunchSpin(kLongSpin, s1_).ok());
  ASSERT_TRUE(LaunchFill(p, kBytes, 1000, s1_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  void* q = *alloc_->Allocate(kBytes, 0, s2_);
  EXPECT_NE(q, p) << "handed out memory that a queued kernel still writes";
  ASSERT_TRUE(LaunchFill(q, kBytes, 2000, s2_).ok());
  ASSERT_TRUE(LaunchCheck(q, kBytes, 2000, mismatches_, s2_).ok());
  EXPECT_EQ(Mismatches(s2_), 0u);
  ASSERT_TRUE(LaunchCheck(p, kBytes, 1000, mismatches_, s1_).ok());  // p's data intact
  EXPECT_EQ(Mismatches(s1_), 0u);
  // Once s1 is idle its cached block may serve s2.
  void* r = *alloc_->Allocate(kBytes, 0, s2_);
  EXPECT_EQ(r, p);
  EXPECT_EQ(alloc_->GetStats().num_cross_stream_reuse, 1);
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->Free(r).ok());
}

TEST_F(CudaGpuTest, ArenaDiscardWaitsForTheKernelAndPopulatedMemoryIsReused) {
  // Arena mode, strict peak: a block still written by a kernel on s1 is
  // freed; s2 needs as many new pages, so the freed pages are discarded,
  // ordered on s1 behind the kernel, and s2 waits for that on the GPU.
  alloc_ = *CachingManagedAllocator::Create(*backend_, "idle_page_slack:0");
  constexpr std::size_t kBytes = std::size_t{256} << 20;
  void* p = *alloc_->Allocate(kBytes, 0, s1_);
  ASSERT_TRUE(LaunchSpin(kLongSpin, s1_).ok());
  ASSERT_TRUE(LaunchFill(p, kBytes, 1000, s1_).ok());  // still writing when freed
  ASSERT_TRUE(alloc_->Free(p).ok());
  void* q = *alloc_->Allocate(kBytes, 0, s2_);
  EXPECT_NE(q, p);
  EXPECT_EQ(alloc_->GetStats().num_pages_discarded, 128);
  EXPECT_EQ(alloc_->GetStats().num_discard_waits, 1);
  EXPECT_EQ(alloc_->GetStats().num_sync_all_streams, 0);  // no host wait for the kernel
  ASSERT_TRUE(LaunchFill(q, kBytes, 2000, s2_).ok());
  ASSERT_TRUE(LaunchCheck(q, kBytes, 2000, mismatches_, s2_).ok());
  EXPECT_EQ(Mismatches(s2_), 0u);
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s2_).ok());
  // s1 asks again: its own block's pages were discarded, s2's are populated
  // and idle, so s2's block serves and the device's memory does not grow
  // (the driver keeps discarded memory with its pages: new pages would cost
  // new memory in cudaMemGetInfo's view).
  std::size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  void* r = *alloc_->Allocate(kBytes, 0, s1_);
  EXPECT_EQ(r, q);
  ASSERT_TRUE(LaunchFill(r, kBytes, 3000, s1_).ok());
  ASSERT_TRUE(LaunchCheck(r, kBytes, 3000, mismatches_, s1_).ok());
  EXPECT_EQ(Mismatches(s1_), 0u);
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  EXPECT_LT(static_cast<long long>(free_before) - static_cast<long long>(free_after), 32ll << 20)
      << "free before " << free_before << ", after " << free_after;
  ASSERT_TRUE(alloc_->Free(r).ok());
}

TEST_F(CudaGpuTest, SameStreamReuseIsOrderedByTheStream) {
  constexpr std::size_t kBytes = 4 << 20;
  void* p = *alloc_->Allocate(kBytes, 0, s1_);
  ASSERT_TRUE(LaunchSpin(kLongSpin / 4, s1_).ok());
  ASSERT_TRUE(LaunchFill(p, kBytes, 7, s1_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  void* q = *alloc_->Allocate(kBytes, 0, s1_);
  EXPECT_EQ(q, p);  // safe: s1 runs the next kernel after the fill
  ASSERT_TRUE(LaunchFill(q, kBytes, 99, s1_).ok());
  ASSERT_TRUE(LaunchCheck(q, kBytes, 99, mismatches_, s1_).ok());
  EXPECT_EQ(Mismatches(s1_), 0u);
  ASSERT_TRUE(alloc_->Free(q).ok());
}

TEST_F(CudaGpuTest, RecordStreamKeepsBlockUntilOtherStreamFinishes) {
  constexpr std::size_t kBytes = 8 << 20;
  void* p = *alloc_->Allocate(kBytes, 0, s1_);
  ASSERT_TRUE(LaunchFill(p, kBytes, 5, s1_).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  // s2 reads p after a long spin; the host frees p meanwhile.
  ASSERT_TRUE(alloc_->RecordStream(p, s2_).ok());
  ASSERT_TRUE(LaunchSpin(kLongSpin, s2_).ok());
  ASSERT_TRUE(LaunchCheck(p, kBytes, 5, mismatches_, s2_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  void* q = *alloc_->Allocate(kBytes, 0, s1_);
  EXPECT_NE(q, p) << "reused a block another stream still reads";
  ASSERT_TRUE(LaunchFill(q, kBytes, 77, s1_).ok());
  EXPECT_EQ(Mismatches(s2_), 0u);
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  void* r = *alloc_->Allocate(kBytes, 0, s1_);
  EXPECT_EQ(r, p);  // s2's event has completed
  ASSERT_TRUE(alloc_->Free(q).ok());
  ASSERT_TRUE(alloc_->Free(r).ok());
}

TEST_F(CudaGpuTest, PrefetchAndAdviseAreVisibleInRangeAttributes) {
  constexpr std::size_t kBytes = 16 << 20;
  void* p = *alloc_->Allocate(kBytes, 0, s1_);
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kSetReadMostly, Location::Device(0)).ok());
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kSetAccessedBy, Location::Device(0)).ok());
  ASSERT_TRUE(backend_->Prefetch(p, kBytes, Location::Device(0), s1_).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  auto attr = backend_->GetRangeAttributes(p, kBytes);
  ASSERT_TRUE(attr.ok()) << attr.status();
  EXPECT_TRUE(attr->read_mostly);
  EXPECT_EQ(attr->last_prefetch_location, Location::Device(0));
  EXPECT_THAT(attr->accessed_by, ::testing::Contains(0));
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kUnsetReadMostly, Location::Device(0)).ok());
  ASSERT_TRUE(backend_->Advise(p, kBytes, Advice::kUnsetAccessedBy, Location::Device(0)).ok());
  Range r{p, kBytes};
  ASSERT_TRUE(backend_->PrefetchBatch({&r, 1}, Location::Host(), s1_).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  EXPECT_TRUE(backend_->GetRangeAttributes(p, kBytes)->last_prefetch_location.is_host());
  ASSERT_TRUE(alloc_->Free(p).ok());
}

TEST_F(CudaGpuTest, HostPoolMemoryMovesToTheGpuAndBackAndItsFreeWaitsForTheKernel) {
  constexpr std::size_t kBytes = 64 << 20;
  constexpr int kHost = CachingManagedAllocator::kHostDevice;
  auto* p = static_cast<unsigned char*>(*alloc_->Allocate(kBytes, kHost));
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeManaged);
  std::memset(p, 0, kBytes);  // the host populates it
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s1_).ok());
  ASSERT_TRUE(LaunchFill(p, kBytes, 11, s1_).ok());
  ASSERT_TRUE(alloc_->Move(p, Location::Host(), s1_).ok());
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  EXPECT_TRUE(backend_->GetRangeAttributes(p, kBytes)->last_prefetch_location.is_host());
  std::vector<unsigned char> host_copy(p, p + kBytes);  // the CPU reads the GPU's bytes
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s1_).ok());
  ASSERT_TRUE(LaunchCheck(p, kBytes, 11, mismatches_, s1_).ok());
  EXPECT_EQ(Mismatches(s1_), 0u);
  EXPECT_TRUE(std::memcmp(host_copy.data(), p, kBytes) == 0);
  // Freed while a kernel still writes it on the device: not handed out again
  // until the kernel is done, and its pages come home.
  ASSERT_TRUE(alloc_->Move(p, Location::Device(0), s1_).ok());
  ASSERT_TRUE(LaunchSpin(kLongSpin, s1_).ok());
  ASSERT_TRUE(LaunchFill(p, kBytes, 12, s1_).ok());
  ASSERT_TRUE(alloc_->Free(p).ok());
  auto* q = static_cast<unsigned char*>(*alloc_->Allocate(kBytes, kHost));
  EXPECT_NE(q, p) << "handed the CPU memory that a queued kernel still writes";
  std::memset(q, 1, kBytes);
  ASSERT_TRUE(backend_->SynchronizeStream(s1_).ok());
  HostPoolStats st = alloc_->GetHostStats();
  EXPECT_EQ(st.returned_bytes, static_cast<std::int64_t>(kBytes));
  EXPECT_EQ(st.device_resident_bytes.current, 0);
  ASSERT_TRUE(alloc_->Free(q).ok());
  auto* again = static_cast<unsigned char*>(*alloc_->Allocate(kBytes, kHost));
  EXPECT_TRUE(again == p || again == q);
  std::memset(again, 2, kBytes);  // host pages: no fault storm, no error
  EXPECT_EQ(again[kBytes - 1], 2);
  ASSERT_TRUE(alloc_->Free(again).ok());
  ASSERT_TRUE(alloc_->EmptyCache().ok());
  EXPECT_EQ(alloc_->GetHostStats().reserved_bytes.current, 0);
}

// A non-blocking side stream with the events a capture forks it from, and
// joins it back to, the capture stream with (PyTorch's wait_stream).
struct SideStream {
  SideStream() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), cudaSuccess);
  }
  ~SideStream() {
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaStreamDestroy(stream);
  }
  void ForkFrom(cudaStream_t s) {
    EXPECT_EQ(cudaEventRecord(fork, s), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(stream, fork, 0), cudaSuccess);
  }
  void JoinInto(cudaStream_t s) {
    EXPECT_EQ(cudaEventRecord(join, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(s, join, 0), cudaSuccess);
  }
  Stream handle() const { return reinterpret_cast<Stream>(stream); }
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
};

TEST_F(CudaGpuTest, CaptureAllocatesOnAStreamFirstSeenInsideIt) {
  // PyTorch's torch.cuda.graph: a pool context, a global-mode capture on
  // s1, and a side stream joined to it that cma has never seen. Validating
  // that stream must not break the capture.
  if (std::strcmp(backend_->name(), "cuda") != 0) GTEST_SKIP() << "CUDA graphs";
  SideStream side;
  const MemPoolId pool{0, 1};
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, nullptr).ok());
  auto* cap = reinterpret_cast<cudaStream_t>(s1_);
  ASSERT_EQ(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal), cudaSuccess);
  side.ForkFrom(cap);
  constexpr std::size_t kBytes = 1 << 20;
  auto p = alloc_->Allocate(kBytes, 0, side.handle());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(LaunchFill(*p, kBytes, 77, side.handle()).ok());
  side.JoinInto(cap);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(cap, &graph), cudaSuccess) << "the capture was invalidated";
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, cap), cudaSuccess);
  ASSERT_TRUE(LaunchCheck(*p, kBytes, 77, mismatches_, s1_).ok());
  EXPECT_EQ(Mismatches(s1_), 0u);
  ASSERT_TRUE(alloc_->Free(*p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(CudaGpuTest, CaptureReusesABlockOnceItsUsesJoined) {
  // PyTorch's test_graph_capture_reclaim_2_streams on a real graph: a block
  // used on a side stream and freed in the capture is not reused before the
  // capture stream waits for the side stream's kernel, and is after; the
  // graph then replays with both kernels ordered.
  if (std::strcmp(backend_->name(), "cuda") != 0) GTEST_SKIP() << "CUDA graphs";
  SideStream side;
  const MemPoolId pool{0, 2};
  ASSERT_TRUE(alloc_->BeginAllocateToPool(0, pool, nullptr, {.reuse_after_join = true}).ok());
  auto* cap = reinterpret_cast<cudaStream_t>(s1_);
  const Stream side_stream = side.handle();
  ASSERT_EQ(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal), cudaSuccess);
  constexpr std::size_t kBytes = 4096;
  void* data1 = *alloc_->Allocate(kBytes, 0, s1_);
  ASSERT_TRUE(LaunchFill(data1, kBytes, 5, s1_).ok());
  side.ForkFrom(cap);
  void* buf2 = *alloc_->Allocate(kBytes, 0, side_stream);
  ASSERT_TRUE(LaunchCheck(data1, kBytes, 5, mismatches_, side_stream).ok());
  ASSERT_TRUE(alloc_->RecordStream(data1, side_stream).ok());
  ASSERT_TRUE(alloc_->Free(data1).ok());
  void* data2 = *alloc_->Allocate(kBytes, 0, s1_);
  EXPECT_NE(data2, data1) << "reused before the capture stream waited for the side stream";
  side.JoinInto(cap);
  void* data3 = *alloc_->Allocate(kBytes, 0, s1_);
  EXPECT_EQ(data3, data1) << "not reused after the join";
  ASSERT_TRUE(LaunchFill(data3, kBytes, 9, s1_).ok());  // overwrites after the check
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(cap, &graph), cudaSuccess) << "the capture was invalidated";
  ASSERT_TRUE(alloc_->EndAllocateToPool(0, pool).ok());
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(exec, cap), cudaSuccess);
  EXPECT_EQ(Mismatches(s1_), 0u) << "the side stream's check saw the refill";
  for (void* p : {buf2, data2, data3}) ASSERT_TRUE(alloc_->Free(p).ok());
  ASSERT_TRUE(alloc_->ReleasePool(0, pool).ok());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST_F(CudaGpuTest, OomUnderConfiguredLimit) {
  auto limited = CachingManagedAllocator::Create(*backend_, "managed_budget:256M");
  ASSERT_TRUE(limited.ok());
  void* a = *(*limited)->Allocate(200 << 20, 0, s1_);
  auto b = (*limited)->Allocate(100 << 20, 0, s1_);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("out of memory on device 0"));
  EXPECT_THAT(b.status().message(), HasSubstr("managed budget"));
  ASSERT_TRUE((*limited)->Free(a).ok());
}

TEST_F(CudaGpuTest, CudaErrorsNameTheCall) {
  // Only errors that are safe on a shared GPU: advice on memory CUDA does not
  // manage, and a device that does not exist. (No absurd managed sizes, no
  // bogus stream handles: the driver dereferences those.)
  if (std::strcmp(backend_->name(), "cuda") != 0) GTEST_SKIP() << "names CUDA's calls";
  int not_managed[64];
  absl::Status s = backend_->Advise(not_managed, sizeof(not_managed), Advice::kSetReadMostly,
                                    Location::Device(0));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("cudaMemAdvise"));
  EXPECT_THAT(s.message(), HasSubstr("cudaError"));
  EXPECT_THAT(backend_->CreateStream(4096).status().message(), HasSubstr("invalid device 4096"));
  auto facts = backend_->GetDeviceFacts(0);
  ASSERT_TRUE(facts.ok());
  EXPECT_TRUE(facts->concurrent_managed_access);
  EXPECT_GT(facts->vmm_granularity, 0u);
}

}  // namespace
}  // namespace cma
