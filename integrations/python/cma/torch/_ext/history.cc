// History, snapshots and out-of-memory errors of cma's PyTorch allocator
// (cuda_allocator.h).
#include <map>
#include <utility>

#include "cuda_allocator.h"

namespace cma_torch {
namespace internal {

std::shared_ptr<c10::GatheredContext> CmaCudaAllocator::Context(RecordContext needed) {
  cca::CreateContextFn recorder = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (when_ >= needed) recorder = recorder_;
  }
  // Outside the lock: gathering a stack may take the GIL.
  return recorder != nullptr ? recorder() : nullptr;
}

void CmaCudaAllocator::Trace(TraceEntry::Action action, c10::DeviceIndex device, size_t addr,
                             size_t size, cudaStream_t stream,
                             std::shared_ptr<c10::GatheredContext> context,
                             bool to_trackers) {
  // Called with mu_ held.
  if (skip_.count(static_cast<int>(action)) != 0) return;
  TraceEntry te(action, device, addr, size, stream, Pool{0, 0}, c10::getApproximateTime(),
                std::move(context), compile_context_.empty() ? "N/A" : compile_context_.back(),
                user_metadata_);
  if (to_trackers) {
    for (const auto& t : trackers_) t(te);
  }
  if (!history_on_.load(std::memory_order_relaxed)) return;
  traces_.push_back(std::move(te));
  while (traces_.size() > max_entries_) traces_.pop_front();
}

void CmaCudaAllocator::RecordAlloc(void* p, size_t n, c10::DeviceIndex device,
                                   cudaStream_t stream, int64_t reserved_before) {
  std::shared_ptr<c10::GatheredContext> ctx = Context(RecordContext::STATE);
  int64_t grew = 0;
  if (reserved_before >= 0 || c10::memoryProfilingEnabled()) {
    const StatMap m = Stats(device);
    const int64_t reserved = Get(m, "reserved_bytes.all.current");
    if (reserved_before >= 0) grew = reserved - reserved_before;
    if (c10::memoryProfilingEnabled()) {
      c10::reportMemoryUsageToProfiler(p, static_cast<int64_t>(n),
                                       Get(m, "allocated_bytes.all.current"), reserved,
                                       c10::Device(c10::DeviceType::CUDA, device));
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  live_[p] = Live{n, device, stream, ctx};
  freed_.erase(reinterpret_cast<size_t>(p));
  if (grew > 0) {
    // The pages this allocation populated (from the first page it covers;
    // another thread's allocation in between may add to `grew`), as
    // PyTorch's expandable segments trace a map; with the allocation's
    // stack, so that memory_viz names who made the memory. Not to trackers
    // (NCCL's buffer registration), as EmptyCacheTraced's unmaps are not.
    constexpr size_t kPage = size_t{2} << 20;
    Trace(TraceEntry::SEGMENT_MAP, device, reinterpret_cast<size_t>(p) / kPage * kPage,
          static_cast<size_t>(grew), stream, when_ >= RecordContext::ALLOC ? ctx : nullptr,
          /*to_trackers=*/false);
  }
  Trace(TraceEntry::ALLOC, device, reinterpret_cast<size_t>(p), n, stream,
        when_ >= RecordContext::ALLOC ? ctx : nullptr);
}

void CmaCudaAllocator::RecordFree(void* p) {
  std::shared_ptr<c10::GatheredContext> ctx = Context(RecordContext::ALL);
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // allocated before tracking began
  const Live live = it->second;
  live_.erase(it);
  // Bounded: past it, free blocks show no last request (as cma's core).
  constexpr size_t kMaxFreed = size_t{1} << 16;
  if (freed_.size() >= kMaxFreed) freed_.clear();
  freed_[reinterpret_cast<size_t>(p)] = {live.size, ++free_order_};
  if (c10::memoryProfilingEnabled()) {
    c10::reportMemoryUsageToProfiler(p, -static_cast<int64_t>(live.size), 0, 0,
                                     c10::Device(c10::DeviceType::CUDA, live.device));
  }
  const auto addr = reinterpret_cast<size_t>(p);
  // cma frees at once for the caller (other streams' uses are its events):
  // requested and completed together.
  Trace(TraceEntry::FREE_REQUESTED, live.device, addr, live.size, live.stream, ctx);
  Trace(TraceEntry::FREE_COMPLETED, live.device, addr, live.size, live.stream, ctx);
}

namespace {

struct Extent {
  size_t size = 0;
  bool arena = false;
  cudaStream_t stream = nullptr;
};
// Each segment's reported range, by (device, address).
using Extents = std::map<std::pair<int, size_t>, Extent>;

Extents SegmentExtents() {
  struct Ctx {
    Extents out;
    Extent* last = nullptr;
  } ctx;
  auto on_segment = [](void* c, const cma_segment_info* s) {
    auto* x = static_cast<Ctx*>(c);
    x->last = &x->out[{s->device, s->address}];
    *x->last = Extent{s->total_size, s->is_arena != 0, nullptr};
  };
  auto on_block = [](void* c, const cma_block_info* b) {
    auto* x = static_cast<Ctx*>(c);
    x->last->stream = static_cast<cudaStream_t>(b->stream);
  };
  if (api.snapshot_visit(on_segment, on_block, &ctx) != 0) return {};
  return std::move(ctx.out);
}

}  // namespace

void CmaCudaAllocator::EmptyCacheTraced(const std::function<void()>& empty) {
  std::shared_ptr<c10::GatheredContext> ctx = Context(RecordContext::ALL);  // may take the GIL
  std::lock_guard<std::mutex> one_at_a_time(empty_cache_trace_mu_);
  const Extents before = SegmentExtents();
  empty();
  const Extents after = SegmentExtents();
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [key, was] : before) {
    auto it = after.find(key);
    const size_t kept = it == after.end() ? 0 : it->second.size;
    if (kept >= was.size) continue;
    const auto device = static_cast<c10::DeviceIndex>(key.first);
    // An arena keeps its address space and gives back pages (as PyTorch's
    // expandable segments unmap); a classic segment goes whole.
    // Not to trackers (NCCL's buffer registration): cma's segment_map
    // events do not reach them either, so they never saw these ranges.
    Trace(was.arena ? TraceEntry::SEGMENT_UNMAP : TraceEntry::SEGMENT_FREE, device,
          key.second + kept, was.size - kept, was.stream, ctx, /*to_trackers=*/false);
  }
}

void CmaCudaAllocator::RaiseAllocationError(size_t nbytes, c10::DeviceIndex device,
                                            cudaStream_t stream, const char* what) {
  const std::string why = LastError();  // the next cma call replaces it
  const int code = api.last_error_code();
  size_t free_bytes = 0, total = 0;
  const bool known = api.mem_info(device, &free_bytes, &total) == 0;
  // Like PyTorch's own allocator, any request the device cannot hold is an
  // out-of-memory error: over the budget, or larger than the device.
  if (code != kResourceExhausted && !(known && nbytes > total)) {
    char msg[160];
    std::snprintf(msg, sizeof(msg), "%s of %zu bytes on device %d", what, nbytes,
                  static_cast<int>(device));
    TORCH_CHECK(false, "caching_managed_allocator: ", std::string(msg), " failed: ", why);
  }
  const StatMap m = Stats(device);
  const int64_t allocated = Get(m, "allocated_bytes.all.current");
  const int64_t reserved = Get(m, "reserved_bytes.all.current");
  std::vector<cca::OutOfMemoryObserver> observers;
  double fraction = -1.0;  // none set
  if (!Fraction(device, &fraction)) fraction = -1.0;
  {
    std::lock_guard<std::mutex> l(mu_);
    observers = oom_observers_;
    if (history_on_.load() || !trackers_.empty()) {
      Trace(TraceEntry::OOM, device, free_bytes, nbytes, stream, nullptr);
    }
  }
  // PyTorch's observers get (device, the size asked for, the memory allowed
  // (the fraction's share of the device, or its total), the device's free
  // memory), as its own allocator calls them; outside mu_ (they take the GIL).
  const size_t allowed =
      fraction >= 0.0 ? static_cast<size_t>(fraction * static_cast<double>(total)) : total;
  for (const auto& o : observers) o(device, nbytes, allowed, free_bytes);
  c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(nbytes), allocated, reserved,
                                   c10::Device(c10::DeviceType::CUDA, device));
  char allowed_msg[64] = "";  // PyTorch's "X GiB allowed; " when a fraction is set
  if (fraction >= 0.0) {
    std::snprintf(allowed_msg, sizeof(allowed_msg), "%.2f GiB allowed; ", allowed / kGiB);
  }
  char msg[736];
  std::snprintf(msg, sizeof(msg),
                "CUDA out of memory. Tried to allocate %.2f GiB. GPU %d has a total capacity of "
                "%.2f GiB of which %.2f GiB is free. %sOf the allocated memory %.2f GiB is "
                "allocated by caching_managed_allocator, and %.2f GiB is reserved by it but "
                "unallocated. ",
                nbytes / kGiB, static_cast<int>(device), total / kGiB, free_bytes / kGiB,
                allowed_msg, allocated / kGiB, (reserved - allocated) / kGiB);
  TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(msg), "(caching_managed_allocator: ",
                   why, ")");
}

cca::SnapshotInfo CmaCudaAllocator::snapshot(Pool pool, bool include_traces) {
  // PyTorch's readers (memory_snapshot.cpp, Module.cpp's memorySnapshot,
  // cudagraph_trees' get_block_addrs/check_memory_pool) derive each block's
  // address from its segment's address plus the sizes of the blocks before
  // it, and take a segment's owner from segment_pool_id. A cma segment (an
  // arena above all) holds blocks of several pools side by side, so each run
  // of consecutive blocks of one pool is reported as a segment of its own,
  // and a pool's view starts a new segment after every block it leaves out.
  struct Ctx {
    CmaCudaAllocator* self;
    Pool pool;
    cca::SnapshotInfo info;
    std::unordered_map<void*, std::shared_ptr<c10::GatheredContext>> contexts;
    std::map<size_t, std::pair<size_t, uint64_t>> freed;
    cma_segment_info current;  // the cma segment whose blocks are being visited
    bool open;                 // info.segments.back() continues with the next block
  } ctx{this, pool, {}, {}, {}, {}, false};
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [p, live] : live_) ctx.contexts.emplace(p, live.context);
    ctx.freed = freed_;
  }
  auto on_segment = [](void* c, const cma_segment_info* s) {
    auto* x = static_cast<Ctx*>(c);
    x->current = *s;
    x->open = false;
  };
  auto on_block = [](void* c, const cma_block_info* b) {
    auto* x = static_cast<Ctx*>(c);
    const Pool owner{b->pool0, b->pool1};
    const bool filtered = x->pool.first != 0 || x->pool.second != 0;
    if (filtered && owner != x->pool) {
      x->open = false;  // the next block kept is not adjacent to the last one
      return;
    }
    // One segment per run of one pool and one stream, as PyTorch's segments
    // belong to one stream; a no_split pool's block is one by itself.
    if (!x->open || b->own_segment || x->info.segments.back().owner_private_pool_id != owner ||
        x->info.segments.back().stream != b->stream) {
      c10::CachingDeviceAllocator::SegmentInfo seg;
      seg.device = static_cast<c10::DeviceIndex>(x->current.device);
      seg.address = b->address;
      seg.is_large = x->current.is_large != 0;
      seg.is_expandable = x->current.is_arena != 0;
      seg.stream = b->stream;
      seg.owner_private_pool_id = owner;
      x->info.segments.push_back(std::move(seg));
      x->open = true;
    }
    auto& seg = x->info.segments.back();
    c10::CachingDeviceAllocator::BlockInfo info;
    info.size = b->size;
    info.requested_size = b->requested_size;
    info.allocated = b->allocated != 0;
    if (!info.allocated) {
      // PyTorch merges freed neighbours into the block freed last, which
      // keeps its request: the last free inside this one, if tracked.
      uint64_t last = 0;
      for (auto f = x->freed.lower_bound(b->address);
           f != x->freed.end() && f->first < b->address + b->size; ++f) {
        if (f->second.second > last) {
          last = f->second.second;
          info.requested_size = f->second.first;
        }
      }
    }
    info.active = b->active != 0;
    auto it = x->contexts.find(reinterpret_cast<void*>(b->address));
    if (info.allocated && it != x->contexts.end()) info.context_when_allocated = it->second;
    seg.total_size += b->size;
    if (info.allocated) {
      seg.allocated_size += b->size;
      seg.requested_size += b->requested_size;
    }
    if (info.active) seg.active_size += b->size;
    seg.blocks.push_back(std::move(info));
    if (b->own_segment) x->open = false;
  };
  if (api.snapshot_visit(on_segment, on_block, &ctx) != 0) Fail("snapshot");
  // The settings cma follows now (torch.cuda.memory._snapshot()'s
  // "allocator_settings"): the keys cma shares with PyTorch as
  // PYTORCH_CUDA_ALLOC_CONF or the last _set_allocator_settings /
  // _accelerator_setAllocatorSettings left them, else CMA_ALLOC_CONF's; the
  // last settings string cma applied ("" if none); expandable_segments: cma's
  // arenas (segments:arena), which each segment's is_expandable reports too.
  // PyTorch's pinned-memory keys are its own host allocator's: left as they
  // are.
  const cma_live_settings_info live = LiveSettings("snapshot");
  auto& config = ctx.info.config_metadata;
  config.garbage_collection_threshold = live.garbage_collection_threshold;
  config.max_split_size = live.max_split_size;
  config.expandable_segments = live.is_arena != 0;
  config.last_allocator_settings = live.pytorch_settings;
  config.roundup_power2_divisions.assign(
      live.roundup_power2_divisions, live.roundup_power2_divisions + CMA_ROUNDUP_INTERVALS);
  if (include_traces) {
    const int devices = std::max(device_count_.load(), 1);
    ctx.info.device_traces.resize(devices);
    auto to_us = clock_.makeConverter();
    std::lock_guard<std::mutex> l(mu_);
    for (const TraceEntry& te : traces_) {
      if (te.device_ < 0 || te.device_ >= devices) continue;
      TraceEntry copy = te;
      copy.time_.t_ = to_us(te.time_.approx_t_) / 1000;
      ctx.info.device_traces[te.device_].push_back(std::move(copy));
    }
    for (const auto& ae : annotations_) {
      auto copy = ae;
      copy.time_.t_ = to_us(ae.time_.approx_t_) / 1000;
      ctx.info.external_annotations.push_back(std::move(copy));
    }
  }
  return ctx.info;
}

}  // namespace internal
}  // namespace cma_torch
