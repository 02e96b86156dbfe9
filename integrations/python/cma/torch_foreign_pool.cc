// Foreign-allocator pools of cma's PyTorch allocator (torch_foreign_pool.h).
#include "torch_foreign_pool.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "torch_allocator.h"

namespace cma_torch {
namespace internal {
namespace {

using c10::CachingAllocator::StatArray;
using c10::CachingDeviceAllocator::DeviceStats;

// PyTorch's native sizes, so that a pool's segments and splits are the ones
// its users (and PyTorch's tests) expect.
constexpr size_t kMinBlock = 512;
constexpr size_t kSmallSize = size_t{1} << 20;     // largest "small" request
constexpr size_t kSmallBuffer = size_t{2} << 20;   // small requests share these
constexpr size_t kMinLargeAlloc = size_t{10} << 20;
constexpr size_t kLargeBuffer = size_t{20} << 20;  // 1-10 MiB requests share these
constexpr size_t kRoundLarge = size_t{2} << 20;

size_t Round(size_t n) { return n < kMinBlock ? kMinBlock : (n + kMinBlock - 1) / kMinBlock * kMinBlock; }

size_t SegmentSize(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

// PyTorch's StatArray rows: 0 all, 1 small pool, 2 large pool.
void Inc(StatArray& a, bool small, size_t n) {
  for (int i : {0, small ? 1 : 2}) {
    a[i].current += static_cast<int64_t>(n);
    a[i].peak = std::max(a[i].peak, a[i].current);
    a[i].allocated += static_cast<int64_t>(n);
  }
}
void Dec(StatArray& a, bool small, size_t n) {
  for (int i : {0, small ? 1 : 2}) {
    a[i].current -= static_cast<int64_t>(n);
    a[i].freed += static_cast<int64_t>(n);
  }
}

std::string PoolName(c10::MempoolId_t id) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "(%llu, %llu)", static_cast<unsigned long long>(id.first),
                static_cast<unsigned long long>(id.second));
  return buf;
}

bool Accepts(const ForeignPools::Filter& f, cudaStream_t stream) {
  return f == nullptr || (*f)(stream);
}

}  // namespace

bool ForeignPools::BySize::operator()(const Block* a, const Block* b) const {
  const auto sa = reinterpret_cast<uintptr_t>(a->stream);
  const auto sb = reinterpret_cast<uintptr_t>(b->stream);
  if (sa != sb) return sa < sb;
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

ForeignPools::PoolState* ForeignPools::Find(int device, Pool id) {
  auto it = pools_by_key_.find(KeyOf(device, id));
  return it == pools_by_key_.end() ? nullptr : it->second.get();
}

DeviceStats& ForeignPools::StatsOf(int device) { return stats_[device]; }

// ---- pools ----

bool ForeignPools::Knows(int device, Pool id) {
  std::lock_guard<std::mutex> l(mu_);
  return Find(device, id) != nullptr;
}

bool ForeignPools::KnowsAnyDevice(Pool id) {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [key, p] : pools_by_key_) {
    if (p->id == id) return true;
  }
  return false;
}

void ForeignPools::Create(int device, Pool id, ForeignAllocator allocator) {
  TORCH_CHECK(allocator != nullptr, "caching_managed_allocator: createOrIncrefPool: no allocator");
  std::lock_guard<std::mutex> l(mu_);
  TORCH_CHECK(Find(device, id) == nullptr, "caching_managed_allocator: createOrIncrefPool: pool ",
              PoolName(id), " of device ", std::to_string(device),
              " exists already; another allocator cannot be given to it");
  auto p = std::make_unique<PoolState>();
  p->id = id;
  p->device = device;
  p->allocator = std::move(allocator);
  p->use_count = 1;
  pools_by_key_.emplace(KeyOf(device, id), std::move(p));
  pools_.fetch_add(1, std::memory_order_relaxed);
}

bool ForeignPools::Incref(int device, Pool id) {
  std::lock_guard<std::mutex> l(mu_);
  PoolState* p = Find(device, id);
  if (p == nullptr) return false;
  ++p->use_count;
  return true;
}

bool ForeignPools::Release(int device, Pool id) {
  std::vector<Freed> freed;
  {
    std::lock_guard<std::mutex> l(mu_);
    PoolState* p = Find(device, id);
    if (p == nullptr) return false;
    if (p->use_count <= 0) {
      TORCH_WARN("caching_managed_allocator: releasePool: pool ", PoolName(id),
                 " holds no reference");
      return true;
    }
    --p->use_count;
    EraseIfDone(p, &freed);  // released and holding no segment: gone
  }
  GiveBack(&freed);
  return true;
}

bool ForeignPools::UseCount(int device, Pool id, int* count) {
  std::lock_guard<std::mutex> l(mu_);
  PoolState* p = Find(device, id);
  if (p == nullptr) return false;
  *count = p->use_count;
  return true;
}

bool ForeignPools::SetUseOnOOM(int device, Pool id, bool on) {
  std::lock_guard<std::mutex> l(mu_);
  PoolState* p = Find(device, id);
  if (p == nullptr) return false;
  p->use_on_oom = on;
  return true;
}

bool ForeignPools::SetNoSplit(int device, Pool id) {
  std::lock_guard<std::mutex> l(mu_);
  PoolState* p = Find(device, id);
  if (p == nullptr) return false;
  p->no_split = true;
  return true;
}

bool ForeignPools::CheckLive(int device, Pool id, const std::unordered_set<void*>& expected,
                             bool* same) {
  std::lock_guard<std::mutex> l(mu_);
  PoolState* p = Find(device, id);
  if (p == nullptr) return false;
  size_t n = 0;
  *same = true;
  for (const auto& [ptr, b] : live_) {
    if (b->segment->pool != p) continue;
    ++n;
    if (expected.count(ptr) == 0) *same = false;
  }
  *same = *same && n == expected.size();
  return true;
}

// ---- contexts ----

bool ForeignPools::Begin(int device, Pool id, Filter filter) {
  std::lock_guard<std::mutex> l(mu_);
  PoolState* p = Find(device, id);
  if (p == nullptr) return false;
  ++p->use_count;  // PyTorch's beginAllocateToPool takes one; releasePool gives it back
  contexts_[device].push_back({id, true, std::move(filter)});
  ++contexts_total_;
  open_foreign_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void ForeignPools::NoteCmaBegin(int device, Pool id, Filter filter) {
  std::lock_guard<std::mutex> l(mu_);
  contexts_[device].push_back({id, false, std::move(filter)});
  ++contexts_total_;
}

bool ForeignPools::End(int device, Pool id, bool foreign) {
  std::lock_guard<std::mutex> l(mu_);
  auto c = contexts_.find(device);
  if (c == contexts_.end()) return false;
  auto it = std::find_if(c->second.begin(), c->second.end(), [&](const Context& x) {
    return x.id == id && x.foreign == foreign;
  });
  if (it == c->second.end()) return false;
  c->second.erase(it);
  if (c->second.empty()) contexts_.erase(c);
  --contexts_total_;
  if (foreign) open_foreign_.fetch_sub(1, std::memory_order_relaxed);
  if (!Quiet()) {  // no capture can be under way now: the deferred frees get their events
    std::vector<Block*> deferred;
    deferred.swap(deferred_);
    for (Block* b : deferred) RecordEvents(b);
    ProcessPending(false);
  }
  return true;
}

// ---- blocks ----

ForeignPools::Block* ForeignPools::TakeFree(PoolState* p, size_t rounded, bool small,
                                            cudaStream_t stream) {
  auto& set = small ? p->free_small : p->free_large;
  Block key;
  key.stream = stream;
  key.size = rounded;
  auto it = set.lower_bound(&key);
  if (it == set.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  set.erase(it);
  b->in_free = false;
  const size_t rest = b->size - rounded;
  // Native's rule: a small block splits off any 512-byte rest, a large one
  // only a rest above 1 MiB.
  const bool split = !p->no_split && (small ? rest >= kMinBlock : rest > kSmallSize);
  if (split) {
    auto* r = new Block;
    r->ptr = b->ptr + rounded;
    r->size = rest;
    r->stream = b->stream;
    r->segment = b->segment;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = rounded;
    r->in_free = true;
    set.insert(r);
  }
  return b;
}

void* ForeignPools::HandOut(Block* b, size_t requested) {
  b->allocated = true;
  b->requested = requested;
  live_[b->ptr] = b;
  live_count_.fetch_add(1, std::memory_order_relaxed);
  const bool small = b->segment->small;
  DeviceStats& s = StatsOf(b->segment->pool->device);
  Inc(s.allocation, small, 1);
  Inc(s.allocated_bytes, small, b->size);
  Inc(s.active, small, 1);
  Inc(s.active_bytes, small, b->size);
  Inc(s.requested_bytes, small, requested);
  return b->ptr;
}

// Into the pool's free set, merged with free neighbours (the lower block
// survives, so a segment's head never goes away).
void ForeignPools::FreeBlock(Block* b) {
  PoolState* p = b->segment->pool;
  auto& set = b->segment->small ? p->free_small : p->free_large;
  // `lo` takes in its next neighbour `hi`, which goes.
  auto absorb = [](Block* lo, Block* hi) {
    lo->size += hi->size;
    lo->next = hi->next;
    if (hi->next != nullptr) hi->next->prev = lo;
    delete hi;
  };
  if (b->prev != nullptr && b->prev->in_free) {
    Block* prev = b->prev;
    set.erase(prev);
    absorb(prev, b);
    b = prev;
  }
  if (b->next != nullptr && b->next->in_free) {
    set.erase(b->next);
    absorb(b, b->next);
  }
  b->in_free = true;
  set.insert(b);
}

void ForeignPools::MarkFree(Block* b) {
  DeviceStats& s = StatsOf(b->segment->pool->device);
  Dec(s.active, b->segment->small, 1);
  Dec(s.active_bytes, b->segment->small, b->size);
  b->uses.clear();
  FreeBlock(b);
}

// An event on every stream the block was used on; the block is free once
// they complete (ProcessPending). A stream whose event cannot be made is
// synchronised instead.
void ForeignPools::RecordEvents(Block* b) {
  for (const c10::cuda::CUDAStream& s : b->uses) {
    c10::cuda::CUDAGuard g(s.device_index());
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess &&
        cudaEventRecord(e, s.stream()) == cudaSuccess) {
      b->events.emplace_back(s.device_index(), e);
      continue;
    }
    (void)cudaGetLastError();
    if (e != nullptr) (void)cudaEventDestroy(e);
    (void)cudaStreamSynchronize(s.stream());
  }
  b->uses.clear();
  if (b->events.empty()) {
    MarkFree(b);
  } else {
    pending_.push_back(b);
  }
}

void ForeignPools::ProcessPending(bool synchronize) {
  std::vector<Block*> waiting;
  for (Block* b : pending_) {
    bool done = true;
    for (const auto& [device, e] : b->events) {
      c10::cuda::CUDAGuard g(device);
      const cudaError_t r = synchronize ? cudaEventSynchronize(e) : cudaEventQuery(e);
      if (r == cudaErrorNotReady) {
        (void)cudaGetLastError();
        done = false;
        break;
      }
      if (r != cudaSuccess) {  // a broken event cannot guard anything: wait for the device
        (void)cudaGetLastError();
        (void)cudaDeviceSynchronize();
      }
    }
    if (!done) {
      waiting.push_back(b);
      continue;
    }
    for (const auto& [device, e] : b->events) {
      c10::cuda::CUDAGuard g(device);
      (void)cudaEventDestroy(e);
    }
    b->events.clear();
    MarkFree(b);
  }
  pending_.swap(waiting);
}

bool ForeignPools::Free(void* ptr) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  Block* b = it->second;
  live_.erase(it);
  live_count_.fetch_sub(1, std::memory_order_relaxed);
  b->allocated = false;
  const bool small = b->segment->small;
  DeviceStats& s = StatsOf(b->segment->pool->device);
  Dec(s.allocation, small, 1);
  Dec(s.allocated_bytes, small, b->size);
  Dec(s.requested_bytes, small, b->requested);
  b->requested = 0;
  if (b->uses.empty()) {
    MarkFree(b);
  } else if (Quiet()) {
    deferred_.push_back(b);  // no event call while a capture may be under way
  } else {
    RecordEvents(b);
  }
  if (!Quiet() && !pending_.empty()) ProcessPending(false);
  return true;
}

bool ForeignPools::RecordStream(void* ptr, c10::cuda::CUDAStream stream) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return false;
  Block* b = it->second;
  if (stream.stream() == b->stream) return true;  // its own stream orders it already
  if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) {
    b->uses.push_back(stream);
  }
  return true;
}

// ---- allocation ----

bool ForeignPools::Allocate(size_t nbytes, int device, cudaStream_t stream, void** out) {
  const size_t rounded = Round(nbytes);
  const bool small = rounded <= kSmallSize;
  Pool id;
  ForeignAllocator allocator;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto c = contexts_.find(device);
    if (c == contexts_.end()) return false;
    const Context* hit = nullptr;
    for (auto it = c->second.rbegin(); it != c->second.rend(); ++it) {
      if (Accepts(it->filter, stream)) {
        hit = &*it;
        break;
      }
    }
    if (hit == nullptr || !hit->foreign) return false;  // cma's (its core routes it)
    PoolState* p = Find(device, hit->id);
    if (p == nullptr) return false;  // unreachable: the context holds a reference
    if (Block* b = TakeFree(p, rounded, small, stream)) {
      *out = HandOut(b, nbytes);
      return true;
    }
    id = p->id;
    allocator = p->allocator;
    ++p->growing;  // keeps the pool while the lock is dropped
  }
  auto done_growing = [&]() {
    std::vector<Freed> freed;
    {
      std::lock_guard<std::mutex> l(mu_);
      PoolState* p = Find(device, id);
      --p->growing;
      EraseIfDone(p, &freed);
    }
    GiveBack(&freed);
  };
  const size_t size = SegmentSize(rounded);
  try {
    std::lock_guard<std::mutex> b(budget_mu_);
    Admit(device, size);  // counts `size` as held, or throws OutOfMemoryError
  } catch (...) {
    done_growing();
    throw;
  }
  auto unadmit = [&]() {
    {
      std::lock_guard<std::mutex> l(mu_);
      held_[device] -= size;
    }
    UpdateBudget(device);
  };
  void* base = nullptr;
  try {
    c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device));
    base = allocator->raw_alloc_with_stream(size, stream);
  } catch (...) {
    unadmit();
    done_growing();
    throw;
  }
  if (base == nullptr) {
    unadmit();
    done_growing();
    char msg[200];
    std::snprintf(msg, sizeof(msg),
                  "CUDA out of memory. Tried to allocate %.2f GiB on GPU %d: the allocator of "
                  "MemPool %s returned no memory (caching_managed_allocator)",
                  static_cast<double>(size) / kGiB, device, PoolName(id).c_str());
    TORCH_CHECK_WITH(OutOfMemoryError, false, std::string(msg));
  }
  std::lock_guard<std::mutex> l(mu_);
  PoolState* p = Find(device, id);
  --p->growing;
  auto* seg = new Segment;
  seg->pool = p;
  seg->size = size;
  seg->small = small;
  auto* b = new Block;
  b->ptr = static_cast<char*>(base);
  b->size = size;
  b->stream = stream;
  b->segment = seg;
  seg->head = b;
  p->segments.push_back(seg);
  DeviceStats& s = StatsOf(device);
  Inc(s.segment, small, 1);
  Inc(s.reserved_bytes, small, size);
  ++s.num_device_alloc;
  b->in_free = true;
  (small ? p->free_small : p->free_large).insert(b);
  Block* got = TakeFree(p, rounded, small, stream);
  *out = HandOut(got, nbytes);
  return true;
}

void* ForeignPools::TakeOnOom(size_t nbytes, int device, cudaStream_t stream) {
  const size_t rounded = Round(nbytes);
  const bool small = rounded <= kSmallSize;
  std::lock_guard<std::mutex> l(mu_);
  // As PyTorch: an allocation a pool context routes stays out of memory.
  auto c = contexts_.find(device);
  if (c != contexts_.end()) {
    for (const Context& x : c->second) {
      if (Accepts(x.filter, stream)) return nullptr;
    }
  }
  if (!Quiet() && !pending_.empty()) ProcessPending(false);
  for (auto& [key, p] : pools_by_key_) {  // by id: the order the pools were made in
    if (p->device != device || !p->use_on_oom || p->use_count <= 0) continue;
    if (Block* b = TakeFree(p.get(), rounded, small, stream)) return HandOut(b, nbytes);
  }
  return nullptr;
}

// ---- giving memory back ----

void ForeignPools::CollectFreeSegments(PoolState* p, std::vector<Freed>* out) {
  std::vector<Segment*> kept;
  for (Segment* seg : p->segments) {
    Block* h = seg->head;
    if (!h->in_free || h->next != nullptr) {  // some block of it is in use
      kept.push_back(seg);
      continue;
    }
    (seg->small ? p->free_small : p->free_large).erase(h);
    out->push_back({p->allocator, h->ptr, p->device});
    DeviceStats& s = StatsOf(p->device);
    Dec(s.segment, seg->small, 1);
    Dec(s.reserved_bytes, seg->small, seg->size);
    ++s.num_device_free;
    held_[p->device] -= seg->size;
    delete h;
    delete seg;
  }
  p->segments.swap(kept);
}

void ForeignPools::EraseIfDone(PoolState* p, std::vector<Freed>* out) {
  if (p->use_count > 0 || p->growing > 0 || !p->segments.empty()) return;
  // The allocator reference is dropped outside the lock, with the memory.
  out->push_back({std::move(p->allocator), nullptr, p->device});
  pools_by_key_.erase(KeyOf(p->device, p->id));
  pools_.fetch_sub(1, std::memory_order_relaxed);
}

void ForeignPools::GiveBack(std::vector<Freed>* freed) {
  for (Freed& f : *freed) {
    if (f.ptr == nullptr) continue;
    try {
      c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(f.device));
      f.allocator->raw_delete(f.ptr);
    } catch (const std::exception& e) {  // emptyCache and destructors must go on
      TORCH_WARN("caching_managed_allocator: a MemPool's allocator failed to free memory: ",
                 e.what());
    }
  }
  freed->clear();  // the last reference on an allocator goes here
}

void ForeignPools::EmptyCache(Pool id) {
  const bool all = id.first == 0 && id.second == 0;
  std::vector<Freed> freed;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (Quiet()) return;  // a capture may be under way: nothing is freed (as cma's core)
    ProcessPending(true);
    for (auto it = pools_by_key_.begin(); it != pools_by_key_.end();) {
      PoolState* p = (it++)->second.get();  // EraseIfDone may erase it
      if (!all && p->id != id) continue;
      if (p->use_count > 0 || p->growing > 0) continue;  // live pools keep their memory
      CollectFreeSegments(p, &freed);
      EraseIfDone(p, &freed);
    }
  }
  std::unordered_set<int> devices;
  for (const Freed& f : freed) devices.insert(f.device);
  GiveBack(&freed);
  for (int d : devices) UpdateBudget(d);
}

size_t ForeignPools::ReleaseFreeable(int device) {
  std::vector<Freed> freed;
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (Quiet()) return 0;
    const size_t before = held_[device];
    for (auto it = pools_by_key_.begin(); it != pools_by_key_.end();) {
      PoolState* p = (it++)->second.get();
      if (p->device != device || p->use_count > 0 || p->growing > 0) continue;
      CollectFreeSegments(p, &freed);
      EraseIfDone(p, &freed);
    }
    bytes = before - held_[device];
  }
  GiveBack(&freed);
  if (bytes > 0) UpdateBudget(device);
  return bytes;
}

}  // namespace internal
}  // namespace cma_torch
