#include "allocator/host_pool.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"  // NotMine(), SplitAtPages()
#include "allocator/format.h"
#include "backends/mutex_lock.h"

namespace cma {

namespace {

void PutStat(std::map<std::string, std::int64_t>& m, const std::string& name, const Stat& s) {
  m[name + ".current"] = s.current;
  m[name + ".peak"] = s.peak;
  m[name + ".allocated"] = s.allocated;
  m[name + ".freed"] = s.freed;
}

}  // namespace

static absl::Status QuietRefusal(const char* what) {
  return absl::FailedPreconditionError(absl::StrFormat(
      "cma: %s of a host allocation while a private pool is being allocated to (a CUDA graph "
      "capture may be under way); end the pool context first",
      what));
}

std::map<std::string, std::int64_t> HostPoolStats::Flatten() const {
  std::map<std::string, std::int64_t> m;
  PutStat(m, "allocation", allocation);
  PutStat(m, "segment", segment);
  PutStat(m, "allocated_bytes", allocated_bytes);
  PutStat(m, "requested_bytes", requested_bytes);
  PutStat(m, "reserved_bytes", reserved_bytes);
  PutStat(m, "device_resident_bytes", device_resident_bytes);
  m["pending_frees"] = pending_frees;
  m["moves"] = moves;
  m["moved_bytes_to_device"] = moved_bytes_to_device;
  m["moved_bytes_to_host"] = moved_bytes_to_host;
  m["mapped_moves"] = mapped_moves;
  m["mapped_bytes"] = mapped_bytes;
  m["advise_calls"] = advise_calls;
  m["returned_bytes"] = returned_bytes;
  m["num_alloc_retries"] = num_alloc_retries;
  m["num_ooms"] = num_ooms;
  m["num_sync_streams"] = num_sync_streams;
  m["num_placement_errors"] = num_placement_errors;
  m["budget_bytes"] = budget_bytes;
  return m;
}

HostPool::HostPool(Backend* backend, int device_count, std::size_t budget,
                   std::function<bool()> quiet, HostLedger* ledger)
    : backend_(backend),
      device_count_(device_count),
      budget_(budget),
      quiet_(std::move(quiet)),
      ledger_(ledger) {
  stats_.budget_bytes = static_cast<std::int64_t>(budget);
}

HostPool::~HostPool() {
  MutexLock l(&mu_);
  for (Pending& p : pending_) {
    for (Event e : p.events) (void)backend_->DestroyEvent(e);
  }
  for (auto& [addr, b] : blocks_) {
    if (b->chunk_class < 0) (void)backend_->FreeManaged(reinterpret_cast<void*>(addr));
  }
  for (auto& [base, slab] : slabs_) (void)backend_->FreeManaged(reinterpret_cast<void*>(base));
  if (ledger_ != nullptr) ledger_->Give(static_cast<std::size_t>(stats_.reserved_bytes.current));
}

HostPool::Block* HostPool::Find(void* ptr) {
  auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it == blocks_.end() ? nullptr : it->second.get();
}

absl::StatusOr<void*> HostPool::Allocate(std::size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cma: host allocation of 0 bytes");
  const std::size_t rounded = HostRound(bytes);
  if (rounded == 0 || rounded > budget_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: host allocation of %s (%d bytes) is larger than the host pool's budget of %s",
        FormatBytes(bytes), bytes, FormatBytes(budget_)));
  }
  MutexLock l(&mu_);
  if (!pending_.empty()) ProcessPending(/*wait=*/false);
  if (Block* b = TakeCached(rounded)) return HandOut(b, bytes);
  absl::StatusOr<Block*> carved = Carve(rounded);
  if (!carved.ok() && absl::IsResourceExhausted(carved.status()) && !Quiet()) {
    // Wait for the GPU's work on pending frees, give the cache back, retry.
    ++stats_.num_alloc_retries;
    ProcessPending(/*wait=*/true);
    if (Block* b = TakeCached(rounded)) return HandOut(b, bytes);
    ReleaseIdle();
    carved = Carve(rounded);
  }
  if (!carved.ok()) {
    if (absl::IsResourceExhausted(carved.status())) ++stats_.num_ooms;
    return carved.status();
  }
  return HandOut(*carved, bytes);
}

HostPool::Block* HostPool::TakeCached(std::size_t rounded) {
  const int cls = HostChunkClass(rounded);
  if (cls >= 0) {
    auto& list = free_chunks_[cls];
    if (!list.empty()) {
      Block* b = *list.begin();
      list.erase(list.begin());
      ++slabs_[b->slab].in_use;
      return b;
    }
    // The slab being carved for this class, one chunk at a time: a slab of
    // 512-byte chunks would otherwise cost 4096 blocks' bookkeeping at once.
    const std::uintptr_t base = carving_[cls];
    if (base == 0) return nullptr;
    Slab& slab = slabs_[base];
    Block* b = NewChunk(base, cls, slab.carved++);
    if ((slab.carved + 1) * rounded > kHostSlabSize) carving_[cls] = 0;  // carved whole
    ++slab.in_use;
    return b;
  }
  Block probe;
  probe.size = rounded;
  auto it = free_segments_.lower_bound(&probe);
  if (it == free_segments_.end() || !HostSegmentCanServe((*it)->size, rounded)) return nullptr;
  Block* b = *it;
  free_segments_.erase(it);
  return b;
}

absl::StatusOr<HostPool::Block*> HostPool::Carve(std::size_t rounded) {
  const int cls = HostChunkClass(rounded);
  const std::size_t size = cls >= 0 ? kHostSlabSize : rounded;
  const auto held = static_cast<std::size_t>(stats_.reserved_bytes.current);
  if (held + size > budget_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cma: the host pool cannot hold %s more: %s of its budget of %s is held (%s in use)",
        FormatBytes(size), FormatBytes(held), FormatBytes(budget_),
        FormatBytes(static_cast<std::size_t>(stats_.allocated_bytes.current))));
  }
  if (ledger_ != nullptr && !ledger_->TryTake(size)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cma: the host pool cannot hold %s more: with oversubscription's host tier, cma holds "
        "%s of the host's %s",
        FormatBytes(size), FormatBytes(ledger_->held()), FormatBytes(ledger_->cap())));
  }
  // Device 0 is only the runtime's context here: ReserveManaged populates
  // nothing, and the host's first touch places the pages.
  absl::StatusOr<void*> mem = backend_->ReserveManaged(0, size);
  if (!mem.ok()) {
    if (ledger_ != nullptr) ledger_->Give(size);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cma: the host pool could not reserve %s of managed memory: %s", FormatBytes(size),
        mem.status().message()));
  }
  const auto base = reinterpret_cast<std::uintptr_t>(*mem);
  stats_.segment.Add(1);
  stats_.reserved_bytes.Add(static_cast<std::int64_t>(size));
  if (cls < 0) {
    auto b = std::make_unique<Block>();
    b->addr = base;
    b->size = rounded;
    Block* raw = b.get();
    blocks_.emplace(base, std::move(b));
    return raw;
  }
  // A slab: its first chunk serves the request; the rest are carved when
  // needed (TakeCached).
  slabs_[base] = Slab{cls, 1, 1};
  carving_[cls] = 2 * rounded <= kHostSlabSize ? base : 0;
  return NewChunk(base, cls, 0);
}

HostPool::Block* HostPool::NewChunk(std::uintptr_t slab, int cls, std::size_t index) {
  const std::size_t size = kHostMinChunk << cls;
  auto b = std::make_unique<Block>();
  b->addr = slab + index * size;
  b->size = size;
  b->chunk_class = cls;
  b->slab = slab;
  Block* raw = b.get();
  blocks_.emplace(raw->addr, std::move(b));
  return raw;
}

void* HostPool::HandOut(Block* b, std::size_t requested) {
  b->allocated = true;
  b->requested = requested;
  stats_.allocation.Add(1);
  stats_.allocated_bytes.Add(static_cast<std::int64_t>(b->size));
  stats_.requested_bytes.Add(static_cast<std::int64_t>(requested));
  return reinterpret_cast<void*>(b->addr);
}

void HostPool::MakeFree(Block* b) {
  b->pending = false;
  b->uses.clear();
  if (b->chunk_class >= 0) {
    free_chunks_[b->chunk_class].insert(b);
    --slabs_[b->slab].in_use;
  } else {
    free_segments_.insert(b);
  }
}

void HostPool::SetResidence(Block* b, Location where) {
  const bool was_on_device = !b->location.is_host();
  b->location = where;
  if (!b->allocated) return;
  const auto n = static_cast<std::int64_t>(b->size);
  if (was_on_device && where.is_host()) stats_.device_resident_bytes.Sub(n);
  if (!was_on_device && !where.is_host()) stats_.device_resident_bytes.Add(n);
}

void HostPool::AddUse(Block* b, Stream stream, int device) {
  for (const auto& u : b->uses) {
    if (u.first == stream) return;
  }
  b->uses.emplace_back(stream, device);
}

absl::Status HostPool::RecordStream(void* ptr, Stream stream, int device) {
  MutexLock l(&mu_);
  Block* b = Find(ptr);
  if (b == nullptr) return NotMine();
  if (!b->allocated) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cma: record_stream on host allocation %p, which is free", ptr));
  }
  AddUse(b, stream, device < 0 ? b->last_device : device);
  return absl::OkStatus();
}

absl::Status HostPool::Move(absl::Span<void* const> ptrs, Location target, Stream stream,
                            bool contents_dead) {
  MutexLock l(&mu_);
  if (Quiet()) return QuietRefusal("move");
  std::vector<Block*> blocks;
  std::vector<Range> ranges;
  for (void* p : ptrs) {
    Block* b = Find(p);
    if (b == nullptr || !b->allocated) return NotMine();
    blocks.push_back(b);
    ranges.push_back(Range{p, b->size});
  }
  if (!target.is_host()) {
    if (absl::Status s = backend_->ValidateStream(target.device, stream); !s.ok()) return s;
  }
  // Allocations that prefer the host are mapped for the device, not moved;
  // the others drop advice a former owner left.
  std::vector<Range> migrate;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    if (target.is_host() || !PrefersHost(*blocks[i])) {
      ApplyHints(blocks[i], blocks[i]->hints.get());
      migrate.push_back(ranges[i]);
    }
  }
  if (!migrate.empty()) {
    if (absl::Status s = Place(migrate, target, stream, contents_dead); !s.ok()) return s;
  }
  for (Block* b : blocks) {
    if (!target.is_host() && PrefersHost(*b)) {
      ApplyHints(b, b->hints.get());
      std::vector<int>& by = b->applied->accessed_by;
      if (std::find(by.begin(), by.end(), target.device) == by.end()) {
        Advise(b, {{Advice::kSetAccessedBy, target}});
        by.push_back(target.device);
      }
      AddUse(b, stream, target.device);
      b->last_device = target.device;
      ++stats_.mapped_moves;
      stats_.mapped_bytes += static_cast<std::int64_t>(b->size);
      continue;
    }
    const int device = target.is_host() ? b->last_device : target.device;
    AddUse(b, stream, device);
    b->last_stream = stream;
    b->last_device = device;
    SetResidence(b, target);
    ++stats_.moves;
    (target.is_host() ? stats_.moved_bytes_to_host : stats_.moved_bytes_to_device) +=
        static_cast<std::int64_t>(b->size);
  }
  return absl::OkStatus();
}

void HostPool::Advise(Block* b, const AdviceList& advice) {
  for (const auto& [a, location] : advice) {
    if (backend_->Advise(reinterpret_cast<void*>(b->addr), b->size, a, location).ok()) {
      ++stats_.advise_calls;
    } else {
      ++stats_.num_placement_errors;  // advice is a hint: the memory stays valid
    }
  }
}

absl::Status HostPool::SetHints(void* ptr, const AllocationHints& hints) {
  for (int d : hints.accessed_by) {
    if (d < 0 || d >= device_count_) {
      return absl::InvalidArgumentError(absl::StrFormat("cma: accessed_by names device %d", d));
    }
  }
  MutexLock l(&mu_);
  Block* b = Find(ptr);
  if (b == nullptr || !b->allocated) return NotMine();
  if (Quiet()) return QuietRefusal("advice");
  if (b->chunk_class >= 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: advice for host allocation %p of %d bytes: allocations of 1 MiB or less share "
        "pages with others, which the advice would cover too",
        ptr, b->requested));
  }
  b->hints = std::make_unique<AllocationHints>(hints);
  ApplyHints(b, b->hints.get());
  return absl::OkStatus();
}

void HostPool::ApplyHints(Block* b, const AllocationHints* want) {
  const AllocationHints none;
  const AllocationHints& w = want != nullptr ? *want : none;
  if (b->applied != nullptr) {
    const AllocationHints& in_force = *b->applied;
    bool covered = in_force.read_mostly == w.read_mostly &&
                   in_force.preferred_location == w.preferred_location;
    for (int d : w.accessed_by) {
      covered = covered && std::find(in_force.accessed_by.begin(), in_force.accessed_by.end(),
                                     d) != in_force.accessed_by.end();
    }
    // Extra accessed-by devices only keep mappings: harmless, kept.
    if (covered) return;
    Advise(b, WithdrawHintAdvice(in_force));
    b->applied.reset();
  }
  if (want == nullptr) return;
  Advise(b, HintAdvice(w));
  b->applied = std::make_unique<AllocationHints>(w);
}

absl::Status HostPool::Place(absl::Span<const Range> ranges, Location target, Stream stream,
                             bool contents_dead) {
  if (!contents_dead) return backend_->PrefetchBatch(ranges, target, stream);
  std::vector<Range> whole, partial;
  for (const Range& r : ranges) SplitAtPages(r, &whole, &partial);
  absl::Status s;
  if (!whole.empty()) s = backend_->DiscardAndPrefetchBatch(whole, target, stream);
  if (s.ok() && !partial.empty()) s = backend_->PrefetchBatch(partial, target, stream);
  return s;
}

absl::StatusOr<std::size_t> HostPool::RequestedSize(void* ptr) {
  MutexLock l(&mu_);
  Block* b = Find(ptr);
  if (b == nullptr || !b->allocated) return NotMine();
  return b->requested;
}

absl::StatusOr<Location> HostPool::LocationOf(void* ptr) {
  MutexLock l(&mu_);
  Block* b = Find(ptr);
  if (b == nullptr || !b->allocated) return NotMine();
  return b->location;
}

void HostPool::ReleaseIdle() {
  for (auto it = free_segments_.begin(); it != free_segments_.end();) {
    Block* b = *it;
    if (!backend_->FreeManaged(reinterpret_cast<void*>(b->addr)).ok()) {
      ++stats_.num_placement_errors;  // still ours: cached, released another time
      ++it;
      continue;
    }
    it = free_segments_.erase(it);
    stats_.segment.Sub(1);
    stats_.reserved_bytes.Sub(static_cast<std::int64_t>(b->size));
    if (ledger_ != nullptr) ledger_->Give(b->size);
    blocks_.erase(b->addr);
  }
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    auto cur = it++;
    if (cur->second.in_use != 0) continue;
    const std::uintptr_t base = cur->first;
    const int cls = cur->second.chunk_class;
    const std::size_t chunk = kHostMinChunk << cls;
    if (!backend_->FreeManaged(reinterpret_cast<void*>(base)).ok()) {
      ++stats_.num_placement_errors;  // still ours: its chunks stay cached
      continue;
    }
    for (std::size_t i = 0; i < cur->second.carved; ++i) {
      auto b = blocks_.find(base + i * chunk);
      free_chunks_[cls].erase(b->second.get());
      blocks_.erase(b);
    }
    if (carving_[cls] == base) carving_[cls] = 0;
    stats_.segment.Sub(1);
    stats_.reserved_bytes.Sub(static_cast<std::int64_t>(kHostSlabSize));
    if (ledger_ != nullptr) ledger_->Give(kHostSlabSize);
    slabs_.erase(cur);
  }
}

absl::Status HostPool::EmptyCache() {
  MutexLock l(&mu_);
  if (!pending_.empty()) ProcessPending(/*wait=*/false);
  ReleaseIdle();
  return absl::OkStatus();
}

HostPoolStats HostPool::GetStats() {
  MutexLock l(&mu_);
  return stats_;
}

std::vector<BlockSnapshot> HostPool::Snapshot() {
  MutexLock l(&mu_);
  std::vector<BlockSnapshot> out;
  for (const auto& [addr, b] : blocks_) {
    if (!b->allocated && !b->pending) continue;
    BlockSnapshot bs;
    bs.address = b->addr;
    bs.size = b->size;
    bs.requested = b->requested;
    bs.state = b->allocated ? "active_allocated" : "active_pending_free";
    bs.stream = b->last_stream;
    bs.location = LocationName(b->location);
    bs.populated_end = b->size;
    out.push_back(std::move(bs));
  }
  std::sort(out.begin(), out.end(),
            [](const BlockSnapshot& x, const BlockSnapshot& y) { return x.address < y.address; });
  return out;
}

void HostPool::ResetPeakStats() {
  MutexLock l(&mu_);
  for (Stat* s : {&stats_.allocation, &stats_.segment, &stats_.allocated_bytes,
                  &stats_.requested_bytes, &stats_.reserved_bytes,
                  &stats_.device_resident_bytes}) {
    s->peak = s->current;
  }
}

absl::Status HostPool::CheckInvariants() {
  MutexLock l(&mu_);
  std::int64_t allocated = 0, allocated_bytes = 0, requested = 0, on_device = 0, reserved = 0;
  std::size_t free_listed = 0, pending = 0;
  absl::flat_hash_map<std::uintptr_t, int> slab_use;
  for (const auto& [addr, b] : blocks_) {
    if (b->allocated) {
      ++allocated;
      allocated_bytes += static_cast<std::int64_t>(b->size);
      requested += static_cast<std::int64_t>(b->requested);
      if (!b->location.is_host()) on_device += static_cast<std::int64_t>(b->size);
    }
    if (b->pending) ++pending;
    const bool listed = b->chunk_class >= 0 ? free_chunks_[b->chunk_class].contains(b.get())
                                            : free_segments_.contains(b.get());
    if (listed != (!b->allocated && !b->pending)) {
      return absl::InternalError(absl::StrFormat(
          "host pool: block %#x is %s but %s a free list", addr,
          b->allocated ? "allocated" : (b->pending ? "pending" : "free"),
          listed ? "on" : "not on"));
    }
    if (b->chunk_class >= 0) {
      if (b->allocated || b->pending) ++slab_use[b->slab];
    } else {
      reserved += static_cast<std::int64_t>(b->size);
    }
  }
  for (const auto& [base, slab] : slabs_) {
    reserved += static_cast<std::int64_t>(kHostSlabSize);
    if (slab_use[base] != slab.in_use) {
      return absl::InternalError(absl::StrFormat("host pool: slab %#x counts %d chunks in use, "
                                                 "%d are",
                                                 base, slab.in_use, slab_use[base]));
    }
  }
  for (const auto& list : free_chunks_) free_listed += list.size();
  free_listed += free_segments_.size();
  if (pending != pending_.size() || free_listed + pending + static_cast<std::size_t>(allocated) !=
                                        blocks_.size()) {
    return absl::InternalError("host pool: free lists and pending frees do not tile the blocks");
  }
  if (allocated != stats_.allocation.current || allocated_bytes != stats_.allocated_bytes.current ||
      requested != stats_.requested_bytes.current || reserved != stats_.reserved_bytes.current ||
      on_device != stats_.device_resident_bytes.current) {
    return absl::InternalError(absl::StrFormat(
        "host pool: statistics disagree with a recount (allocations %d/%d, bytes %d/%d, "
        "requested %d/%d, reserved %d/%d, on a device %d/%d)",
        stats_.allocation.current, allocated, stats_.allocated_bytes.current, allocated_bytes,
        stats_.requested_bytes.current, requested, stats_.reserved_bytes.current, reserved,
        stats_.device_resident_bytes.current, on_device));
  }
  return absl::OkStatus();
}

}  // namespace cma
