#include "allocator/caching_managed_allocator.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "policy/oversubscription.h"

namespace cma {

absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> CachingManagedAllocator::Create(
    Backend& backend, absl::string_view config) {
  absl::StatusOr<AllocatorConfig> parsed = ParseAllocatorConfig(config);
  if (!parsed.ok()) return parsed.status();
  return Create(backend, *std::move(parsed));
}

absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> CachingManagedAllocator::Create(
    Backend& backend, AllocatorConfig config) {
#ifdef NDEBUG
  // Debian builds Abseil with Mutex deadlock detection on, which costs more
  // than the rest of an allocation; optimised builds turn it off, as
  // Abseil's own release builds do.
  static const bool once = [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    return true;
  }();
  (void)once;
#endif
  absl::StatusOr<int> count = backend.DeviceCount();
  if (!count.ok()) return count.status();
  if (*count <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cma: the ", backend.name(), " backend reports no device"));
  }
  for (int d : config.accessed_by) {
    if (d >= *count) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "CMA_ALLOC_CONF: accessed_by names device %d but the backend has %d", d, *count));
    }
  }
  // Policies that leave a page's first placement to the GPU's first touch
  // need managed memory to migrate on page faults; without it (ROCm without
  // XNACK) the GPU would read such pages remotely for as long as they live.
  if (config.prefetch != PrefetchPolicy::kOnAlloc) {
    for (int d = 0; d < *count; ++d) {
      absl::StatusOr<DeviceFacts> facts = backend.GetDeviceFacts(d);
      if (!facts.ok()) return facts.status();
      if (!facts->page_fault_migration) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "cma: prefetch:%s leaves pages to move on the GPU's first touch, but device %d of "
            "the %s backend does not migrate managed memory on page faults (%s); use "
            "prefetch:on_alloc",
            config.prefetch == PrefetchPolicy::kNone ? "none" : "on_move", d, backend.name(),
            facts->managed_memory_note.empty() ? "the backend says so"
                                               : facts->managed_memory_note));
      }
    }
  }
  // Oversubscribing devices share the host's memory evenly.
  std::size_t host_share = 0;
  if (config.oversubscribe) {
    absl::StatusOr<MemInfo> host = backend.GetHostMemInfo();
    if (!host.ok()) return host.status();
    host_share = host->free_bytes / static_cast<std::size_t>(*count);
  }
  std::unique_ptr<CachingManagedAllocator> a(new CachingManagedAllocator(backend, std::move(config)));
  // The host pool may hold at most the host's memory: managed memory is not
  // refused when the host runs out, the process is killed on first touch.
  // Where the host's memory cannot be read, the backend alone bounds it.
  absl::StatusOr<MemInfo> host_mem = backend.GetHostMemInfo();
  const std::size_t host_cap = host_mem.ok() ? host_mem->total_bytes : SIZE_MAX / 2;
  // One cap for everything cma places on the host: the host pool and the
  // devices' host tiers each have a budget, and together the host's memory.
  a->host_ledger_ = std::make_unique<HostLedger>(host_cap);
  CachingManagedAllocator* raw = a.get();
  a->host_ = std::make_unique<HostPool>(
      &backend, *count, host_cap,
      [raw] {
        for (auto& d : raw->devices_) {
          if (d->AllocatingToPool()) return true;
        }
        return false;
      },
      a->host_ledger_.get());
  // No call here may need a device's context (device facts are read without
  // one): each device plans its budget at its first use (PlanBudget). What
  // the configuration asks is checked now against the whole device.
  for (int d = 0; d < *count; ++d) {
    absl::StatusOr<DeviceFacts> facts = backend.GetDeviceFacts(d);
    if (!facts.ok()) return facts.status();
    absl::StatusOr<TierBudgets> budgets =
        PlanTierBudgets(a->config_, d, facts->total_bytes, host_share);
    if (!budgets.ok()) return budgets.status();
    a->devices_.push_back(std::make_unique<DeviceAllocator>(
        d, *count, &backend, &a->config_, facts->total_bytes, host_share,
        a->host_ledger_.get()));
  }
  return a;
}

absl::Status CachingManagedAllocator::BadDevice(int device) const {
  return absl::InvalidArgumentError(absl::StrFormat(
      "cma: invalid device %d (the %s backend has %d devices)", device, backend_.name(),
      devices_.size()));
}

absl::StatusOr<DeviceAllocator*> CachingManagedAllocator::Device(int device) {
  if (ABSL_PREDICT_FALSE(device < 0 || device >= static_cast<int>(devices_.size()))) {
    return BadDevice(device);
  }
  return devices_[device].get();
}

absl::Status CachingManagedAllocator::CheckHints(const AllocationHints& hints) const {
  const int n = static_cast<int>(devices_.size());
  if (hints.preferred_location && !hints.preferred_location->is_host() &&
      (hints.preferred_location->device < 0 || hints.preferred_location->device >= n)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: hint names preferred device %d (%d devices)", hints.preferred_location->device, n));
  }
  for (int d : hints.accessed_by) {
    if (d < 0 || d >= n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cma: hint names accessed-by device %d (%d devices)", d, n));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> CachingManagedAllocator::Allocate(std::size_t bytes, int device,
                                                        Stream stream,
                                                        const AllocationHints* hints) {
  if (device == kHostDevice) {
    if (hints != nullptr) {
      return absl::InvalidArgumentError("cma: hints are for device allocations, not host ones");
    }
    // Near the host's shared cap, the host tiers' idle memory goes first,
    // as each side's own retry frees only its own cache.
    if (ABSL_PREDICT_FALSE(HostCapShort(bytes))) {
      for (auto& d : devices_) d->ReleaseIdleHostTier();
    }
    return host_->Allocate(bytes);
  }
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  if (ABSL_PREDICT_FALSE(hints != nullptr)) {
    if (absl::Status s = CheckHints(*hints); !s.ok()) return s;
  }
  // The same for a device whose host tier may place it: the host pool's
  // idle memory first.
  if (ABSL_PREDICT_FALSE(config_.oversubscribe) && HostCapShort(bytes)) {
    (void)host_->EmptyCache();
  }
  return (*d)->Allocate(bytes, stream, hints);
}

absl::Status CachingManagedAllocator::Move(void* ptr, Location target, Stream stream,
                                           bool contents_dead) {
  return MoveBatch({&ptr, 1}, target, stream, contents_dead);
}

absl::Status CachingManagedAllocator::SendAway(absl::Span<void* const> ptrs, Stream stream) {
  return SetAway(ptrs, /*away=*/true, stream);
}

absl::Status CachingManagedAllocator::BringBack(absl::Span<void* const> ptrs, Stream stream) {
  return SetAway(ptrs, /*away=*/false, stream);
}

absl::Status CachingManagedAllocator::SetAway(absl::Span<void* const> ptrs, bool away,
                                              Stream stream) {
  const char* what = away ? "send_away" : "bring_back";
  std::vector<std::vector<void*>> groups(devices_.size());
  for (void* p : ptrs) {
    absl::StatusOr<int> d = DeviceOf(p);
    if (!d.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cma: %s of %p, which is not an allocation of this allocator", what, p));
    }
    if (*d == kHostDevice) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cma: %s of %p, an allocation of the host pool: it lives on the host", what, p));
    }
    groups[static_cast<std::size_t>(*d)].push_back(p);
  }
  // Every device's group is checked before any moves.
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t d = 0; d < groups.size(); ++d) {
      if (groups[d].empty()) continue;
      absl::Status s = devices_[d]->SetAway(groups[d], away, stream, /*check_only=*/pass == 0);
      if (absl::IsNotFound(s)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("cma: an allocation was freed during %s", what));
      }
      if (!s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CachingManagedAllocator::MoveBatch(absl::Span<void* const> ptrs, Location target,
                                                Stream stream, bool contents_dead) {
  if (!target.is_host() &&
      (target.device < 0 || target.device >= static_cast<int>(devices_.size()))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cma: move to invalid device %d (%d devices)", target.device, devices_.size()));
  }
  // Group by owning device (the host pool's last); every pointer must be
  // ours before anything moves.
  std::vector<std::vector<void*>> groups(devices_.size() + 1);
  for (void* p : ptrs) {
    absl::StatusOr<int> d = DeviceOf(p);
    if (!d.ok()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("cma: move of %p, which is not an allocation of this allocator", p));
    }
    groups[*d == kHostDevice ? devices_.size() : static_cast<std::size_t>(*d)].push_back(p);
  }
  // The host group moves last: a device group's refusal (a stream of
  // another device, ...) then leaves it where it was.
  std::vector<void*> host_group = std::move(groups.back());
  groups.pop_back();
  // What is not managed memory is refused before anything moves.
  for (std::size_t d = 0; d < groups.size(); ++d) {
    if (groups[d].empty()) continue;
    absl::Status s = devices_[d]->CheckMovable(groups[d]);
    if (absl::IsNotFound(s)) {
      return absl::InvalidArgumentError("cma: an allocation was freed while it was being moved");
    }
    if (!s.ok()) return s;
  }
  for (std::size_t d = 0; d < groups.size(); ++d) {
    if (groups[d].empty()) continue;
    absl::Status s = devices_[d]->Move(groups[d], target, stream, contents_dead);
    if (absl::IsNotFound(s)) {
      return absl::InvalidArgumentError("cma: an allocation was freed while it was being moved");
    }
    if (!s.ok()) return s;
  }
  if (!host_group.empty()) {
    absl::Status s = host_->Move(host_group, target, stream, contents_dead);
    if (absl::IsNotFound(s)) {
      return absl::InvalidArgumentError("cma: an allocation was freed while it was being moved");
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CachingManagedAllocator::SetDisposable(void* ptr, bool disposable) {
  for (auto& d : devices_) {
    absl::Status s = d->SetDisposable(ptr, disposable);
    if (!absl::IsNotFound(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("cma: %p is not an allocation of this allocator", ptr));
}

absl::Status CachingManagedAllocator::SetKeep(void* ptr, bool keep) {
  for (auto& d : devices_) {
    absl::Status s = d->SetKeep(ptr, keep);
    if (!absl::IsNotFound(s)) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("cma: %p is not an allocation of this allocator", ptr));
}

absl::StatusOr<std::size_t> CachingManagedAllocator::Sleep(int device, Stream stream,
                                                           SleepLevel level) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->Sleep(stream, level);
}

absl::StatusOr<std::size_t> CachingManagedAllocator::ReleaseSleepStaging(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->ReleaseSleepStaging();
}

absl::StatusOr<std::size_t> CachingManagedAllocator::Wake(int device, Stream stream) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->Wake(stream);
}

absl::Status CachingManagedAllocator::SetHints(void* ptr, const AllocationHints& hints) {
  if (absl::Status s = CheckHints(hints); !s.ok()) return s;
  for (auto& d : devices_) {
    absl::Status s = d->SetHints(ptr, hints);
    if (!absl::IsNotFound(s)) return s;
  }
  if (absl::Status s = host_->SetHints(ptr, hints); !absl::IsNotFound(s)) return s;
  return absl::InvalidArgumentError(
      absl::StrFormat("cma: hints for %p, which is not an allocation of this allocator", ptr));
}

absl::Status CachingManagedAllocator::Free(void* ptr) {
  if (ptr == nullptr) return absl::InvalidArgumentError("cma: free of a null pointer");
  for (auto& d : devices_) {
    absl::Status s = d->Free(ptr);
    if (!absl::IsNotFound(s)) return s;
  }
  if (absl::Status s = host_->Free(ptr); !absl::IsNotFound(s)) return s;
  return absl::InvalidArgumentError(absl::StrFormat(
      "cma: free of %p, which this allocator did not allocate (foreign pointer)", ptr));
}

absl::Status CachingManagedAllocator::RecordStream(void* ptr, Stream stream) {
  for (auto& d : devices_) {
    absl::Status s = d->RecordStream(ptr, stream);
    if (!absl::IsNotFound(s)) return s;
  }
  // The stream's device is not known here: the allocation's last device is
  // the guess, and a free that cannot record there waits for the stream.
  if (absl::Status s = host_->RecordStream(ptr, stream, /*device=*/-1); !absl::IsNotFound(s)) {
    return s;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "cma: record_stream on %p, which is not an allocation of this allocator", ptr));
}

absl::StatusOr<int> CachingManagedAllocator::DeviceOf(void* ptr) {
  for (auto& d : devices_) {
    if (d->Lookup(ptr).ok()) return d->device();
  }
  if (host_->RequestedSize(ptr).ok()) return kHostDevice;
  return absl::InvalidArgumentError(
      absl::StrFormat("cma: %p is not an allocation of this allocator", ptr));
}

absl::StatusOr<std::size_t> CachingManagedAllocator::RequestedSize(void* ptr) {
  for (auto& d : devices_) {
    if (auto l = d->Lookup(ptr); l.ok()) return l->first;
  }
  if (auto n = host_->RequestedSize(ptr); n.ok()) return *n;
  return absl::InvalidArgumentError(
      absl::StrFormat("cma: %p is not an allocation of this allocator", ptr));
}

absl::Status CachingManagedAllocator::RefuseWhileAnyPoolContext(const char* what) {
  // Checked on every device first, so that a refusal changes nothing.
  for (auto& d : devices_) {
    if (d->AllocatingToPool()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "cma: %s while a private pool of device %d is being allocated to (a CUDA graph "
          "capture may be under way); end the pool context first",
          what, d->device()));
    }
  }
  return absl::OkStatus();
}

absl::Status CachingManagedAllocator::EmptyCache() {
  if (absl::Status s = RefuseWhileAnyPoolContext("empty_cache"); !s.ok()) return s;
  for (auto& d : devices_) {
    if (absl::Status s = d->EmptyCache(); !s.ok()) return s;
  }
  return host_->EmptyCache();
}

absl::Status CachingManagedAllocator::CreateOrIncrefPool(int device, MemPoolId id) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->CreateOrIncrefPool(id);
  return absl::OkStatus();
}

absl::Status CachingManagedAllocator::CreatePoolWithSource(int device, MemPoolId id,
                                                           std::shared_ptr<SegmentSource> source) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->CreatePoolWithSource(id, std::move(source));
}

absl::Status CachingManagedAllocator::BeginAllocateToPool(int device, MemPoolId id,
                                                          StreamFilter filter,
                                                          PoolContextOptions options) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->BeginAllocateToPool(id, std::move(filter), options);
  return absl::OkStatus();
}

absl::Status CachingManagedAllocator::EndAllocateToPool(int device, MemPoolId id) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->EndAllocateToPool(id);
}

absl::Status CachingManagedAllocator::ReleasePool(int device, MemPoolId id) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->ReleasePool(id);
}

absl::Status CachingManagedAllocator::SetPoolOptions(int device, MemPoolId id,
                                                     PoolOptions options) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->SetPoolOptions(id, options);
}

absl::StatusOr<PoolOptions> CachingManagedAllocator::GetPoolOptions(int device, MemPoolId id) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->GetPoolOptions(id);
}

bool CachingManagedAllocator::AllocatingToPool(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  return d.ok() && (*d)->AllocatingToPool();
}

absl::StatusOr<bool> CachingManagedAllocator::CheckPoolLiveAllocations(
    int device, MemPoolId id, absl::Span<void* const> expected) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->CheckPoolLiveAllocations(id, expected);
}

absl::StatusOr<int> CachingManagedAllocator::GetPoolUseCount(int device, MemPoolId id) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->GetPoolUseCount(id);
}

absl::Status CachingManagedAllocator::EmptyPoolCache(int device, MemPoolId id) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->EmptyPoolCache(id);
}

absl::StatusOr<PoolCheckpoint> CachingManagedAllocator::TakePoolCheckpoint(int device,
                                                                          MemPoolId id) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->TakePoolCheckpoint(id);
}

absl::StatusOr<PoolRestoreResult> CachingManagedAllocator::RestorePoolCheckpoint(
    const PoolCheckpoint& checkpoint) {
  absl::StatusOr<DeviceAllocator*> d = Device(checkpoint.device);
  if (!d.ok()) return d.status();
  return (*d)->RestorePoolCheckpoint(checkpoint);
}

absl::Status CachingManagedAllocator::ForgetStream(Stream stream) {
  if (stream == kDefaultStream) {
    return absl::InvalidArgumentError("cma: the default stream cannot be forgotten");
  }
  if (absl::Status s = RefuseWhileAnyPoolContext("forget_stream"); !s.ok()) return s;
  for (auto& d : devices_) {
    if (absl::Status s = d->ForgetStream(stream); !s.ok()) return s;
  }
  return host_->ForgetStream(stream);
}

absl::StatusOr<DeviceStats> CachingManagedAllocator::GetStats(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->GetStats();
}

absl::StatusOr<std::string> CachingManagedAllocator::LastPlacementError(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  absl::Status s = (*d)->LastPlacementError();
  return s.ok() ? std::string() : s.ToString();
}

DeviceStats CachingManagedAllocator::GetStats() {
  DeviceStats total;
  for (auto& d : devices_) total += d->GetStats();
  return total;
}

absl::Status CachingManagedAllocator::SetHostRouting(int device, bool on) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->SetHostRouting(on);
}

absl::Status CachingManagedAllocator::MarkIteration(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->MarkIteration();
  return absl::OkStatus();
}

absl::Status CachingManagedAllocator::NoteUses(int device, absl::Span<void* const> ptrs,
                                              Stream stream) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->NoteUses(ptrs, stream);
}

absl::StatusOr<bool> CachingManagedAllocator::PlacedOnHost(void* ptr) {
  for (auto& d : devices_) {
    absl::StatusOr<bool> on_host = d->PlacedOnHost(ptr);
    if (!absl::IsNotFound(on_host.status())) return on_host;
  }
  if (absl::StatusOr<Location> where = host_->LocationOf(ptr); where.ok()) {
    return where->is_host();
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("cma: %p is not an allocation of this allocator", ptr));
}

absl::Status CachingManagedAllocator::SetMemoryFraction(double fraction, int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  if (!(fraction >= 0.0 && fraction <= 1.0)) {  // also NaN
    return absl::InvalidArgumentError(
        absl::StrFormat("cma: memory fraction %g is not in [0, 1]", fraction));
  }
  (*d)->SetBudget(static_cast<std::size_t>(fraction * static_cast<double>((*d)->device_total())));
  return absl::OkStatus();
}

absl::Status CachingManagedAllocator::ApplyPyTorchSettings(absl::string_view pytorch_settings) {
  absl::StatusOr<SharedSettings> s = ParsePyTorchSharedSettings(pytorch_settings, config_);
  if (!s.ok()) return s.status();
  for (auto& d : devices_) d->SetSharedSettings(*s);
  return absl::OkStatus();
}

AllocatorConfig CachingManagedAllocator::LiveConfig() {
  return devices_.empty() ? config_ : devices_.front()->LiveConfig();
}

absl::Status CachingManagedAllocator::ResetPeakStats(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->ResetPeakStats();
  return absl::OkStatus();
}

absl::StatusOr<std::size_t> CachingManagedAllocator::TakeLivePeak(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  return (*d)->TakeLivePeak();
}

absl::Status CachingManagedAllocator::ResetAccumulatedStats(int device) {
  absl::StatusOr<DeviceAllocator*> d = Device(device);
  if (!d.ok()) return d.status();
  (*d)->ResetAccumulatedStats();
  return absl::OkStatus();
}

std::vector<SegmentSnapshot> CachingManagedAllocator::Snapshot() {
  std::vector<SegmentSnapshot> out;
  for (auto& d : devices_) d->AppendSnapshot(&out);
  return out;
}

absl::Status CachingManagedAllocator::CheckInvariants() {
  for (auto& d : devices_) {
    if (absl::Status s = d->CheckInvariants(); !s.ok()) {
      return absl::InternalError(absl::StrCat("device ", d->device(), ": ", s.message()));
    }
  }
  if (absl::Status s = host_->CheckInvariants(); !s.ok()) return s;
  // The shared host cap holds exactly what both sides hold (each side's
  // statistic is checked against its segments above). Racy against other
  // threads' allocations, as the other checks are: call it when quiet.
  std::int64_t held = GetHostStats().reserved_bytes.current;
  for (auto& d : devices_) {
    absl::StatusOr<DeviceStats> st = GetStats(d->device());
    if (st.ok()) held += st->host_resident_bytes[kAllPools].current;
  }
  if (static_cast<std::size_t>(held) != host_ledger_->held()) {
    return absl::InternalError(absl::StrFormat(
        "the host ledger holds %d bytes, the host pool and the host tiers %d",
        host_ledger_->held(), held));
  }
  return absl::OkStatus();
}

}  // namespace cma
