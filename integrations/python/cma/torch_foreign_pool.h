// Private pools whose memory comes from another CUDAAllocator, under cma's
// PyTorch allocator (torch_allocator.h): torch.cuda.MemPool(allocator) with
// a CUDAPluggableAllocator's allocator(), or NCCL's mem_allocator that
// torch.distributed uses for user-buffer registration. cma's core pools
// (allocator/mempool.h) hold cma's managed memory; these hold the foreign
// allocator's and live here, in the glue, because that allocator is a torch
// object.
//
// Semantics (PyTorch's native allocator's, which the MemPool tests of
// PyTorch's test_cuda.py pin):
// - A pool's segments come from its allocator's raw_alloc_with_stream (sizes
//   as native: requests up to 1 MiB share 2 MiB segments, up to 10 MiB 20 MiB
//   ones, larger ones are rounded to 2 MiB) and are cut into blocks (best fit,
//   split, merged again on free). A freed block stays in its pool and serves
//   that pool's later requests on the same stream; other allocations never
//   see it, except through use_on_oom (TakeOnOom).
// - Memory goes back (raw_delete) only from a released pool (no MemPool or
//   context holds it), on emptyCache (global or of that pool), and only for
//   segments wholly free, as PyTorch's emptyCache(mempool_id) does. A pool
//   keeps its allocator (shared_ptr) until it is released and holds no
//   segment, so memory is given back to the allocator that made it even if
//   the user dropped every Python reference to it.
// - Routing: every pool context the class opens (cma's own too) is mirrored
//   here per device, in order; an allocation goes to the pool of the latest
//   context whose filter accepts its stream (as in cma's core and PyTorch).
//   Route() is only consulted while a foreign context is open (AnyOpen(), one
//   relaxed atomic load), so cma's ordinary allocations pay nothing more.
// - Streams: a block freed after recordStream on other streams is reusable
//   only once events recorded on those streams at free time have completed.
//   While any pool context is open (a CUDA graph capture may be under way)
//   no event is recorded or queried: such frees wait for the last context's
//   end, as in PyTorch.
// - Budget: bytes held from foreign allocators count against the user's
//   memory fraction (SetFraction): a new segment is refused with
//   OutOfMemoryError when cma's reserved bytes plus the foreign bytes would
//   exceed fraction * total, and cma's budget is kept at fraction * total
//   minus the foreign bytes held. Fraction() returns what the user set.
//
// Thread safety: every method may be called from any thread. One mutex
// guards the pools; the foreign allocator is called outside it. Budget
// changes are serialised by a second mutex taken before the first.
// Errors: methods throw c10::Error (RuntimeError naming cma and the method)
// on bad input, leaving state unchanged; Free and RecordStream's failure
// paths, and everything called from destructors, warn instead of throwing.
#ifndef CMA_TORCH_FOREIGN_POOL_H_
#define CMA_TORCH_FOREIGN_POOL_H_

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace cma_torch {
namespace internal {

class ForeignPools {
 public:
  using Pool = c10::MempoolId_t;
  using Filter = std::shared_ptr<const std::function<bool(cudaStream_t)>>;
  using ForeignAllocator = std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>;

  ForeignPools() = default;
  ForeignPools(const ForeignPools&) = delete;
  ForeignPools& operator=(const ForeignPools&) = delete;

  // ---- pools ----
  // Whether `id` on `device` is a foreign pool.
  bool Knows(int device, Pool id);
  bool KnowsAnyDevice(Pool id);
  // A new foreign pool with one reference. Refused if it exists already.
  void Create(int device, Pool id, ForeignAllocator allocator);
  // These return false (doing nothing) when `id` is not a foreign pool, so
  // that the caller hands the call to cma's core.
  bool Incref(int device, Pool id);
  bool Release(int device, Pool id);  // warns when no reference is held
  bool UseCount(int device, Pool id, int* count);
  bool SetUseOnOOM(int device, Pool id, bool on);
  bool SetNoSplit(int device, Pool id);
  bool CheckLive(int device, Pool id, const std::unordered_set<void*>& expected, bool* same);

  // ---- contexts ----
  // A context of foreign pool `id` (takes a reference, as PyTorch's
  // beginAllocateToPool does; releasePool gives it back). False: not foreign.
  bool Begin(int device, Pool id, Filter filter);
  // Ends the oldest open context of `id` (foreign or, if `foreign` is false,
  // a mirrored one of cma's); false when there is none.
  bool End(int device, Pool id, bool foreign);
  // Mirrors a context of one of cma's core pools (for the routing order).
  void NoteCmaBegin(int device, Pool id, Filter filter);
  bool AnyOpen() const { return open_foreign_.load(std::memory_order_relaxed) != 0; }

  // ---- allocation ----
  // Serves `nbytes` from the foreign pool whose context routes `stream`
  // (true, with *ptr) or returns false when the allocation is cma's.
  // Throws OutOfMemoryError when the pool cannot grow.
  bool Allocate(size_t nbytes, int device, cudaStream_t stream, void** ptr);
  // After cma's own out-of-memory: whether foreign pools could help.
  bool AnyPools() const { return pools_.load(std::memory_order_relaxed) != 0; }
  // Gives back the wholly free segments of released pools of `device` (the
  // cached memory PyTorch frees before failing); returns the bytes.
  size_t ReleaseFreeable(int device);
  // A free block of a live use_on_oom pool of `device` that fits, for an
  // allocation no pool context routes; nullptr if none.
  void* TakeOnOom(size_t nbytes, int device, cudaStream_t stream);
  bool AnyLive() const { return live_count_.load(std::memory_order_relaxed) != 0; }
  // Frees a block handed out here; false (nothing done) if `ptr` is none.
  bool Free(void* ptr);
  // recordStream of a foreign block; false if `ptr` is not one.
  bool RecordStream(void* ptr, c10::cuda::CUDAStream stream);

  // ---- cache, statistics, snapshots ----
  // PyTorch's emptyCache: every released pool ({0, 0}) or pool `id`.
  void EmptyCache(Pool id);
  void AddStats(int device, c10::CachingDeviceAllocator::DeviceStats* s);
  void ResetPeakStats(int device);  // -1: all
  void ResetAccumulatedStats(int device);
  size_t HeldBytes(int device);
  size_t LargestFree(int device);
  // Appends the segments of pool `id` (every foreign pool for {0, 0}).
  void AppendSnapshot(Pool id, std::vector<c10::CachingDeviceAllocator::SegmentInfo>* out);

  // ---- memory fraction ----
  void SetFraction(double fraction, int device);
  // The user's fraction of `device`; false if none was set.
  bool Fraction(int device, double* fraction);

 private:
  struct PoolState;
  struct Segment;
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    cudaStream_t stream = nullptr;
    bool allocated = false;
    bool in_free = false;  // in its pool's free set (else allocated or awaiting events)
    Block* prev = nullptr;  // neighbours in the segment, by address
    Block* next = nullptr;
    Segment* segment = nullptr;
    std::vector<c10::cuda::CUDAStream> uses;  // recordStream's streams
    std::vector<std::pair<c10::DeviceIndex, cudaEvent_t>> events;
  };
  struct BySize {  // free blocks by (stream, size, address): best fit on a stream
    bool operator()(const Block* a, const Block* b) const;
  };
  struct Segment {
    PoolState* pool = nullptr;
    Block* head = nullptr;  // the block at the segment's base; never merged away
    size_t size = 0;
    bool small = false;
  };
  struct PoolState {
    Pool id;
    int device = 0;
    ForeignAllocator allocator;
    int use_count = 0;
    int growing = 0;  // segment allocations under way outside the lock
    bool use_on_oom = false;
    bool no_split = false;
    std::set<Block*, BySize> free_small, free_large;
    std::vector<Segment*> segments;
  };
  struct Context {
    Pool id;
    bool foreign;
    Filter filter;
  };
  struct Freed {  // memory to give back once the lock is dropped
    ForeignAllocator allocator;
    void* ptr;
    int device;
  };
  using Key = std::tuple<int, uint64_t, uint64_t>;
  static Key KeyOf(int device, Pool id) { return Key(device, id.first, id.second); }

  PoolState* Find(int device, Pool id);  // mu_ held
  Block* TakeFree(PoolState* p, size_t rounded, bool small, cudaStream_t stream);
  void* HandOut(Block* b, size_t requested);
  void FreeBlock(Block* b);
  void MarkFree(Block* b);
  void RecordEvents(Block* b);
  void ProcessPending(bool synchronize);
  void CollectFreeSegments(PoolState* p, std::vector<Freed>* out);
  void EraseIfDone(PoolState* p, std::vector<Freed>* out);
  void GiveBack(std::vector<Freed>* freed);  // mu_ not held
  void Admit(int device, size_t bytes);      // budget_mu_ held
  void ApplyBudget(int device, double fraction);  // budget_mu_ held
  void UpdateBudget(int device);
  c10::CachingDeviceAllocator::DeviceStats& StatsOf(int device);
  bool Quiet() const { return contexts_total_ != 0; }

  std::atomic<int> open_foreign_{0};  // open contexts of foreign pools
  std::atomic<int> pools_{0};         // foreign pools alive
  std::atomic<int64_t> live_count_{0};  // blocks handed out and not freed

  std::mutex budget_mu_;  // taken before mu_
  std::unordered_map<int, double> fractions_;  // guarded by budget_mu_

  std::mutex mu_;  // everything below
  std::map<Key, std::unique_ptr<PoolState>> pools_by_key_;  // ordered: creation order of ids
  std::unordered_map<int, std::vector<Context>> contexts_;  // per device, oldest first
  int contexts_total_ = 0;
  std::unordered_map<void*, Block*> live_;
  std::vector<Block*> deferred_;  // freed with stream uses while quiet
  std::vector<Block*> pending_;   // awaiting their events
  std::unordered_map<int, size_t> held_;  // segment bytes per device
  std::unordered_map<int, c10::CachingDeviceAllocator::DeviceStats> stats_;
};

}  // namespace internal
}  // namespace cma_torch

#endif  // CMA_TORCH_FOREIGN_POOL_H_
