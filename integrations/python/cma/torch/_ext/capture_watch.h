// Pool contexts whose CUDA graph capture failed, so that cma's core does not
// stay quiet for good.
//
// PyTorch's CUDAGraph::capture_end raises on an invalidated capture (a sync
// inside it, an error) before it ends the allocator's pool context, and the
// graph's destructor then releases nothing: the context stays open forever.
// PyTorch's own allocator shrugs that off; cma's core, quiet while any
// context is open (a capture may be under way), would never again populate
// a new allocation, order a cross-stream free or release memory (measured:
// a later 512 MiB torch.empty raised the device's memory in use by 0 MiB).
//
// The watch notices such a context from the thread that began it, where
// PyTorch's capture_begin began the capture right after the context: once
// the context's filter has accepted the stream that was current at its begin
// while that stream was capturing (the capture was seen live), and no
// longer accepts it, the capture is over although its context is open. A
// context whose filter accepted the stream while nothing captured there
// (use_mem_pool, cudagraph trees' stream contexts) is no capture's and is
// not watched further.
//
// Thread safety: every method may be called from any thread. Ownership: the
// watch shares the filters with the contexts. Errors: a filter that throws
// counts as not accepting, and the context stays watched.
#ifndef CMA_INTEGRATIONS_PYTHON_TORCH_CAPTURE_WATCH_H_
#define CMA_INTEGRATIONS_PYTHON_TORCH_CAPTURE_WATCH_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <c10/cuda/CUDACachingAllocator.h>

namespace cma_torch {

class CaptureWatch {
 public:
  using Pool = c10::cuda::MempoolId_t;
  using Filter = std::function<bool(cudaStream_t)>;
  struct Context {
    c10::DeviceIndex device;
    Pool pool;
  };

  void Begin(c10::DeviceIndex device, Pool pool, std::shared_ptr<const Filter> filter,
             cudaStream_t stream);
  // Forgets the newest context of `pool` on `device`, if watched.
  void End(c10::DeviceIndex device, Pool pool);
  // Whether any context may still turn out to be a failed capture: the one
  // load an allocation pays otherwise.
  bool Any() const { return watched_.load(std::memory_order_relaxed) > 0; }
  // The contexts this thread began whose capture is over; forgotten here,
  // for the caller to end and release.
  std::vector<Context> TakeFailed();

 private:
  enum class State { kUnknown, kCapturing };
  struct Entry {
    Context context;
    std::shared_ptr<const Filter> filter;
    cudaStream_t stream;
    std::thread::id thread;
    State state;
  };
  std::mutex mu_;
  std::vector<Entry> entries_;  // guarded by mu_
  std::atomic<int> watched_{0};
};

// Whether `filter` accepts `stream` (false if it throws).
bool AcceptsStream(const CaptureWatch::Filter& filter, cudaStream_t stream);
// Whether `stream` is capturing, or the runtime cannot say (the error is
// cleared, not left for PyTorch's next check).
bool CapturingOrUnknown(cudaStream_t stream);

}  // namespace cma_torch

#endif  // CMA_INTEGRATIONS_PYTHON_TORCH_CAPTURE_WATCH_H_
