// DeviceAllocator's host tier (oversubscription, policy/oversubscription.h):
// allocations that do not fit the device's part of the budget live on the
// host, preferred there and mapped for the device, so the GPU reads and
// writes them over the link and nothing migrates on a fault. Each is one
// segment of whole 2 MiB pages, never split (its advice covers exactly its
// pages); freed, it is cached for its stream like any block.
#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"

#include "absl/strings/str_format.h"
#include "allocator/device_allocator.h"
#include "allocator/format.h"
#include "backends/mutex_lock.h"
#include "policy/oversubscription.h"

namespace cma {

bool DeviceAllocator::DeviceHasRoomFor(std::size_t rounded) const {
  const std::size_t live = populated_pages() - (idle_pages_ - pinned_idle_pages_);
  const std::size_t pages = (rounded + kPageSize - 1) / kPageSize + 1;  // + a shared edge page
  return live + pages <= budget_ / kPageSize;
}

Block* DeviceAllocator::TakeHostBlock(std::size_t rounded, Stream stream) {
  Block probe;
  probe.mempool = 0;
  probe.stream = stream;
  probe.size = rounded;
  probe.addr = 0;
  auto it = host_pool_.lower_bound(&probe);
  if (it == host_pool_.end()) return nullptr;
  Block* b = *it;
  if (b->mempool != 0 || b->stream != stream || !HostBlockFits(b->size, rounded)) return nullptr;
  EraseFree(b);
  return b;
}

absl::StatusOr<Block*> DeviceAllocator::NewHostSegment(std::size_t rounded, PoolKind pool,
                                                       Stream stream) {
  const std::size_t size = (rounded + kPageSize - 1) / kPageSize * kPageSize;
  const auto held = static_cast<std::size_t>(stats_.host_resident_bytes[kAllPools].current);
  if (held + size > host_budget_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "placing %s more on the host would exceed the host part of device %d's managed budget "
        "(%s of %s placed)",
        FormatBytes(size), device_, FormatBytes(held), FormatBytes(host_budget_)));
  }
  if (host_ledger_ != nullptr && !host_ledger_->TryTake(size)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "placing %s more on the host for device %d would pass the host's %s: cma holds %s there "
        "(its CPU tensors' host pool and every device's host tier together)",
        FormatBytes(size), device_, FormatBytes(host_ledger_->cap()),
        FormatBytes(host_ledger_->held())));
  }
  absl::StatusOr<void*> mem = backend_->ReserveManaged(device_, size);
  if (!mem.ok()) {
    if (host_ledger_ != nullptr) host_ledger_->Give(size);
    return mem.status();
  }
  Block* b = AddSegment(*mem, size, pool, stream);
  b->segment->host_tier = true;
  stats_.host_resident_bytes[kAllPools].Add(static_cast<std::int64_t>(size));
  ApplyAdvice(HostTierAdvice(device_), b->ptr(), size);
  // Populated on the host now, in stream order, rather than by the GPU's
  // first touch, which would fault page by page.
  const Range r{b->ptr(), size};
  if (Execute(PlacementAction::kPrefetch, {&r, 1}, Location::Host(), stream).ok()) {
    b->placed = true;
    b->location = Location::Host();
  }
  return b;
}

void* DeviceAllocator::HandOutOnHost(Block* b, std::size_t requested, Stream stream) {
  // The whole segment: a split would put two allocations under one advice.
  void* p = HandOut(b, b->size, requested, b->segment->pool, stream, /*mempool=*/0);
  b->placed = true;
  b->location = Location::Host();
  ++stats_.num_host_placements;
  return p;
}

absl::StatusOr<void*> DeviceAllocator::AllocateOnHost(std::size_t rounded, std::size_t requested,
                                                      PoolKind pool, Stream stream) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1) {
      ++stats_.num_alloc_retries;
      ProcessPendingFrees(/*synchronize=*/true);
      ReleaseFreeHostSegments();
    }
    if (Block* h = TakeHostBlock(rounded, stream)) return HandOutOnHost(h, requested, stream);
    absl::StatusOr<Block*> h = NewHostSegment(rounded, pool, stream);
    if (h.ok()) return HandOutOnHost(*h, requested, stream);
    if (!absl::IsResourceExhausted(h.status()) || attempt == 1) return h.status();
  }
  return absl::InternalError("unreachable");
}

void DeviceAllocator::ReleaseFreeHostSegments() {
  std::vector<Segment*> idle;
  for (Block* b : host_pool_) {
    if (b->segment != nullptr && b->is_free()) idle.push_back(b->segment);  // one block each
  }
  absl::flat_hash_set<Stream> synced;
  for (Segment* seg : idle) {
    const Stream s = seg->first->stream;
    if (!synced.contains(s)) {
      if (!backend_->SynchronizeStream(s).ok()) continue;  // its work may still touch it
      synced.insert(s);
    }
    ReleaseSegment(seg);
  }
  if (!synced.empty()) ++stats_.num_sync_all_streams;
}

void DeviceAllocator::ReleaseIdleHostTier() {
  MutexLock l(&mu_);
  if (host_budget_ == 0 || !RefuseWhileQuiet("release").ok()) return;
  ReleaseFreeHostSegments();
}

absl::Status DeviceAllocator::SetHostRouting(bool on) {
  MutexLock l(&mu_);
  if (absl::Status s = PlanBudget(); !s.ok()) return s;
  if (host_budget_ == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cma: device %d has no host part of its budget: routing allocations to the host needs "
        "oversubscribe:1",
        device_));
  }
  if (!on && host_routing_ == 0) {
    return absl::FailedPreconditionError("cma: host routing was not on");
  }
  host_routing_ += on ? 1 : -1;
  return absl::OkStatus();
}

absl::StatusOr<bool> DeviceAllocator::PlacedOnHost(void* ptr) {
  MutexLock l(&mu_);
  auto it = allocated_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == allocated_.end()) return NotMine();
  return it->second->segment->host_tier;
}

}  // namespace cma
