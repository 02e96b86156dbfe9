#include "backends/mutex_lock.h"
#include "backends/host/host_backend.h"

#include <algorithm>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cma {
namespace {

// The granularity at which reserved managed memory is populated, as the
// allocator's arenas (and CUDA's large pages) count it.
constexpr std::size_t kHostPage = std::size_t{2} << 20;

absl::Status Errno(const char* call) {
  return absl::InternalError(absl::StrFormat("%s failed: %s", call, std::strerror(errno)));
}

}  // namespace

namespace {

// HostBackendOptions' emulated host and domain, from the environment when
// left empty.
HostBackendOptions WithEnvironment(HostBackendOptions o) {
  if (o.host_id.empty()) {
    if (const char* v = std::getenv("CMA_HOST_EMULATED_HOST"); v != nullptr) o.host_id = v;
  }
  if (o.fabric_domain.empty()) {
    if (const char* v = std::getenv("CMA_HOST_FABRIC_DOMAIN"); v != nullptr) o.fabric_domain = v;
  }
  if (const char* v = std::getenv("CMA_HOST_SHMEM_UNREACHABLE"); v != nullptr && v == std::string("1")) {
    o.shmem_unreachable = true;
  }
  return o;
}

}  // namespace

HostBackend::HostBackend(HostBackendOptions options)
    : options_(WithEnvironment(options)),
      capacity_(options.device_count, options.device_capacity),
      used_(options.device_count, 0) {
  streams_[kDefaultStream] = StreamState{-1};
}

HostBackend::~HostBackend() {
  // Tests check LiveResources() before teardown; here we only make sure the
  // process does not keep leaked mappings or descriptors around.
  for (auto& [addr, m] : mappings_) munmap(reinterpret_cast<void*>(addr), m.bytes);
  for (auto& [addr, bytes] : reservations_) munmap(reinterpret_cast<void*>(addr), bytes);
  for (auto& [h, p] : physical_) {
    if (p.fd >= 0) close(p.fd);
    if (!p.shm_name.empty()) shm_unlink(p.shm_name.c_str());
  }
  for (auto& [addr, a] : managed_) munmap(reinterpret_cast<void*>(addr), a.bytes);
  if (pinned_region_ != nullptr) {
    munmap(pinned_region_, options_.pinned_capacity);
  } else {
    for (auto& [addr, bytes] : pinned_) munmap(reinterpret_cast<void*>(addr), bytes);
  }
}

void HostBackend::Count(const char* method) { ++calls_[method]; }

absl::Status HostBackend::CheckDevice(int device) const {
  if (device < 0 || device >= options_.device_count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "invalid device %d: the host backend has %d devices", device, options_.device_count));
  }
  return absl::OkStatus();
}

absl::StatusOr<HostBackend::StreamState*> HostBackend::FindStream(Stream stream) {
  auto it = streams_.find(stream);
  if (it == streams_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unknown stream 0x%x (never created or already destroyed)", stream));
  }
  return &it->second;
}

void HostBackend::Advance(StreamState& s) const {
  if (!options_.manual_completion) s.completed = s.submitted;
  RunCompletedHostFunctions(s);
}

void HostBackend::RunCompletedHostFunctions(StreamState& s) {
  while (!s.host_functions.empty() && s.host_functions.begin()->first <= s.completed) {
    auto fn = std::move(s.host_functions.begin()->second);
    s.host_functions.erase(s.host_functions.begin());
    std::move(fn)();
  }
}

// ---------------------------------------------------------------- devices

absl::StatusOr<int> HostBackend::DeviceCount() {
  MutexLock l(&mu_);
  Count("DeviceCount");
  return options_.device_count;
}

absl::StatusOr<DeviceFacts> HostBackend::GetDeviceFacts(int device) {
  MutexLock l(&mu_);
  Count("GetDeviceFacts");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  DeviceFacts f;
  f.name = absl::StrFormat("host-emulated device %d", device);
  f.total_bytes = capacity_[device];
  f.concurrent_managed_access = true;
  f.pageable_memory_access = true;
  f.page_fault_migration = options_.page_fault_migration;
  if (!f.page_fault_migration) f.managed_memory_note = "emulated: no migration on fault";
  f.vmm_supported = true;
  f.posix_fd_handles = true;
  f.fabric_handles = options_.fabric_handles;
  if (options_.fabric_handles) f.fabric_domain = options_.fabric_domain;
  f.multicast_supported = options_.multicast_supported;
  f.vmm_granularity = options_.vmm_granularity;
  f.runtime = "host emulation";
  return f;
}

absl::StatusOr<MemInfo> HostBackend::GetMemInfo(int device) {
  MutexLock l(&mu_);
  Count("GetMemInfo");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  const std::size_t cap = capacity_[device];
  return MemInfo{cap > used_[device] ? cap - used_[device] : 0, cap};
}

absl::StatusOr<MemInfo> HostBackend::GetHostMemInfo() {
  if (options_.host_available == 0) return Backend::GetHostMemInfo();
  return MemInfo{options_.host_available, std::max(options_.host_total, options_.host_available)};
}

void HostBackend::SetDeviceCapacity(int device, std::size_t bytes) {
  MutexLock l(&mu_);
  if (device >= 0 && device < options_.device_count) capacity_[device] = bytes;
}

// ---------------------------------------------------------------- managed

absl::StatusOr<void*> HostBackend::AllocateManaged(int device, std::size_t bytes) {
  MutexLock l(&mu_);
  Count("AllocateManaged");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("AllocateManaged: size 0");
  if (used_[device] + bytes > capacity_[device] || used_[device] + bytes < bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "AllocateManaged: out of memory on host-emulated device %d (asked %d bytes, %d of %d in "
        "use)",
        device, bytes, used_[device], capacity_[device]));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("AllocateManaged: mmap of %d bytes failed: %s", bytes, strerror(errno)));
  }
  used_[device] += bytes;
  managed_[reinterpret_cast<std::uintptr_t>(p)] = ManagedAllocation{device, bytes, {}};
  return p;
}

absl::StatusOr<void*> HostBackend::ReserveManaged(int device, std::size_t bytes) {
  MutexLock l(&mu_);
  Count("ReserveManaged");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  if (bytes == 0) return absl::InvalidArgumentError("ReserveManaged: size 0");
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("ReserveManaged: mmap of %d bytes failed: %s", bytes, strerror(errno)));
  }
  ManagedAllocation a{device, bytes, {}};
  a.reserved = true;
  a.page_device.assign((bytes + kHostPage - 1) / kHostPage, -1);
  managed_[reinterpret_cast<std::uintptr_t>(p)] = std::move(a);
  return p;
}

void HostBackend::PopulatePages(ManagedAllocation& a, std::uintptr_t base,
                                        const Range& r, PlacementRecord::Op op,
                                        Location location) {
  const auto lo = reinterpret_cast<std::uintptr_t>(r.ptr) - base;
  const std::size_t hi = lo + r.bytes;
  if (op == PlacementRecord::Op::kDiscard || location.is_host()) {
    // Only wholly covered pages leave the device.
    const int to = op == PlacementRecord::Op::kDiscard ? kPageUnpopulated : kPageOnHost;
    for (std::size_t p = (lo + kHostPage - 1) / kHostPage; p < hi / kHostPage; ++p) {
      if (a.page_device[p] >= 0) used_[a.page_device[p]] -= kHostPage;
      // A page that was never populated stays so: moving nothing is free.
      if (to == kPageOnHost && a.page_device[p] == kPageUnpopulated) continue;
      a.page_device[p] = to;
    }
    return;
  }
  // As on a GPU, placing pages past the capacity oversubscribes rather than
  // fails (the driver would evict others): GetMemInfo then reports none free.
  const int d = location.device;
  for (std::size_t p = lo / kHostPage; p <= (hi - 1) / kHostPage; ++p) {
    if (a.page_device[p] == d) continue;
    if (a.page_device[p] >= 0) used_[a.page_device[p]] -= kHostPage;
    a.page_device[p] = d;
    used_[d] += kHostPage;
  }
}

absl::Status HostBackend::FreeManaged(void* ptr) {
  MutexLock l(&mu_);
  Count("FreeManaged");
  auto it = managed_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == managed_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FreeManaged: %p is not a managed allocation of this backend", ptr));
  }
  if (munmap(ptr, it->second.bytes) != 0) return Errno("munmap");
  if (it->second.reserved) {
    for (int d : it->second.page_device) {
      if (d >= 0) used_[d] -= kHostPage;
    }
  } else {
    used_[it->second.device] -= it->second.bytes;
  }
  managed_.erase(it);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- placement

absl::StatusOr<HostBackend::ManagedAllocation*> HostBackend::FindManaged(void* ptr,
                                                                         std::size_t bytes) {
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = managed_.upper_bound(p);
  if (it != managed_.begin()) {
    --it;
    if (p >= it->first && p + bytes <= it->first + it->second.bytes && bytes > 0) {
      return &it->second;
    }
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "range [%p, +%d) does not lie inside one managed allocation", ptr, bytes));
}

absl::Status HostBackend::CheckRanges(absl::Span<const Range> ranges, const char* call) {
  for (const Range& r : ranges) {
    auto a = FindManaged(r.ptr, r.bytes);
    if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat(call, ": ", a.status().message()));
  }
  return absl::OkStatus();
}

void HostBackend::Record(PlacementRecord record) {
  auto st = streams_.find(record.stream);
  record.ticket = st == streams_.end() ? 0 : st->second.submitted;
  record.seq = ++record_seq_;
  records_.push_back(record);
}

absl::Status HostBackend::Advise(void* ptr, std::size_t bytes, Advice advice, Location location) {
  MutexLock l(&mu_);
  Count("Advise");
  auto a = FindManaged(ptr, bytes);
  if (!a.ok()) return absl::InvalidArgumentError(absl::StrCat("Advise: ", a.status().message()));
  if (!location.is_host()) {
    if (auto s = CheckDevice(location.device); !s.ok()) return s;
  }
  RangeAttributes& attr = (*a)->attributes;
  switch (advice) {
    case Advice::kSetReadMostly: attr.read_mostly = true; break;
    case Advice::kUnsetReadMostly: attr.read_mostly = false; break;
    case Advice::kSetPreferredLocation:
      attr.has_preferred_location = true;
      attr.preferred_location = location;
      break;
    case Advice::kUnsetPreferredLocation: attr.has_preferred_location = false; break;
    case Advice::kSetAccessedBy:
      if (location.is_host()) return absl::InvalidArgumentError("Advise: accessed-by needs a device");
      attr.accessed_by.push_back(location.device);
      break;
    case Advice::kUnsetAccessedBy:
      for (auto it = attr.accessed_by.begin(); it != attr.accessed_by.end(); ++it) {
        if (*it == location.device) {
          attr.accessed_by.erase(it);
          break;
        }
      }
      break;
    case Advice::kSetCoarseGrain:
    case Advice::kUnsetCoarseGrain:
      return absl::UnimplementedError("Advise: coarse-grain advice exists only on HIP");
  }
  Record({PlacementRecord::Op::kAdvise, ptr, bytes, advice, location, kDefaultStream, false});
  return absl::OkStatus();
}

absl::Status HostBackend::Place(PlacementRecord::Op op, absl::Span<const Range> ranges,
                                Location location, Stream stream, bool batched,
                                const char* call) {
  if (auto s = CheckRanges(ranges, call); !s.ok()) return s;
  if (op != PlacementRecord::Op::kDiscard && !location.is_host()) {
    if (auto s = CheckDevice(location.device); !s.ok()) return s;
  }
  if (auto st = FindStream(stream); !st.ok()) return st.status();
  for (const Range& r : ranges) {
    auto it = --managed_.upper_bound(reinterpret_cast<std::uintptr_t>(r.ptr));
    if (op != PlacementRecord::Op::kPrefetch) {
      // The contents of discarded pages are gone: zero-filled when next read.
      const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(r.ptr) - it->first;
      const std::uintptr_t first = (lo + kHostPage - 1) / kHostPage * kHostPage;
      const std::uintptr_t last = (lo + r.bytes) / kHostPage * kHostPage;
      if (first < last) {
        madvise(reinterpret_cast<void*>(it->first + first), last - first, MADV_DONTNEED);
      }
    }
    if (it->second.reserved) {
      PopulatePages(it->second, it->first, r, op, location);
    }
    if (op != PlacementRecord::Op::kDiscard) {
      auto a = FindManaged(r.ptr, r.bytes);
      (*a)->attributes.has_last_prefetch = true;
      (*a)->attributes.last_prefetch_location = location;
    }
    Record({op, r.ptr, r.bytes, Advice::kSetReadMostly, location, stream, batched});
  }
  return absl::OkStatus();
}

const HostBackend::ManagedAllocation* HostBackend::ReservedAt(std::uintptr_t p,
                                                              std::uintptr_t* base) const {
  auto it = managed_.upper_bound(p);
  if (it == managed_.begin()) return nullptr;
  --it;
  if (p >= it->first + it->second.bytes || !it->second.reserved) return nullptr;
  *base = it->first;
  return &it->second;
}

int HostBackend::PageLocation(const void* ptr) const {
  MutexLock l(&mu_);
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  std::uintptr_t base = 0;
  const ManagedAllocation* a = ReservedAt(p, &base);
  return a == nullptr ? kPageUnpopulated : a->page_device[(p - base) / kHostPage];
}

bool HostBackend::InReservedRange(const void* ptr) const {
  MutexLock l(&mu_);
  std::uintptr_t base = 0;
  return ReservedAt(reinterpret_cast<std::uintptr_t>(ptr), &base) != nullptr;
}

std::size_t HostBackend::PopulatedBytes(int device) const {
  MutexLock l(&mu_);
  std::size_t bytes = 0;
  for (const auto& [base, a] : managed_) {
    if (a.device != device) continue;
    if (!a.reserved) {
      bytes += a.bytes;
      continue;
    }
    for (int d : a.page_device) bytes += d == kPageUnpopulated ? 0 : kHostPage;
  }
  return bytes;
}

absl::Status HostBackend::Prefetch(void* ptr, std::size_t bytes, Location location,
                                   Stream stream) {
  const Range r{ptr, bytes};
  MutexLock l(&mu_);
  Count("Prefetch");
  return Place(PlacementRecord::Op::kPrefetch, {&r, 1}, location, stream, false, "Prefetch");
}

absl::Status HostBackend::PrefetchBatch(absl::Span<const Range> ranges, Location location,
                                        Stream stream) {
  MutexLock l(&mu_);
  Count("PrefetchBatch");
  return Place(PlacementRecord::Op::kPrefetch, ranges, location, stream, true, "PrefetchBatch");
}

absl::Status HostBackend::DiscardBatch(absl::Span<const Range> ranges, Stream stream) {
  MutexLock l(&mu_);
  Count("DiscardBatch");
  return Place(PlacementRecord::Op::kDiscard, ranges, Location::Host(), stream, true,
               "DiscardBatch");
}

absl::Status HostBackend::DiscardAndPrefetchBatch(absl::Span<const Range> ranges,
                                                  Location location, Stream stream) {
  MutexLock l(&mu_);
  Count("DiscardAndPrefetchBatch");
  return Place(PlacementRecord::Op::kDiscardAndPrefetch, ranges, location, stream, true,
               "DiscardAndPrefetchBatch");
}

absl::StatusOr<RangeAttributes> HostBackend::GetRangeAttributes(void* ptr, std::size_t bytes) {
  MutexLock l(&mu_);
  Count("GetRangeAttributes");
  auto a = FindManaged(ptr, bytes);
  if (!a.ok()) return a.status();
  return (*a)->attributes;
}

std::vector<PlacementRecord> HostBackend::Records() const {
  MutexLock l(&mu_);
  return records_;
}

std::vector<StreamWaitRecord> HostBackend::Waits() const {
  MutexLock l(&mu_);
  return waits_;
}

void HostBackend::ClearRecords() {
  MutexLock l(&mu_);
  records_.clear();
  waits_.clear();
}

std::pair<std::int64_t, std::int64_t> HostBackend::StreamPosition(Stream stream) {
  MutexLock l(&mu_);
  StreamState* st = Settled(stream);
  if (st == nullptr) return {0, 0};
  return {st->submitted, st->completed};
}

// ---------------------------------------------------------------- streams/events

absl::StatusOr<Stream> HostBackend::CreateStream(int device) {
  MutexLock l(&mu_);
  Count("CreateStream");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  const Stream id = next_id_++;
  streams_[id] = StreamState{device};
  return id;
}

absl::Status HostBackend::DestroyStream(Stream stream) {
  MutexLock l(&mu_);
  Count("DestroyStream");
  if (stream == kDefaultStream) {
    return absl::InvalidArgumentError("DestroyStream: the default stream cannot be destroyed");
  }
  if (!streams_.erase(stream)) {
    return absl::InvalidArgumentError(absl::StrFormat("DestroyStream: unknown stream 0x%x", stream));
  }
  return absl::OkStatus();
}

absl::Status HostBackend::ValidateStream(int device, Stream stream) {
  MutexLock l(&mu_);
  Count("ValidateStream");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  if ((*st)->device != -1 && (*st)->device != device) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "stream 0x%x belongs to device %d, not device %d", stream, (*st)->device, device));
  }
  return absl::OkStatus();
}

absl::Status HostBackend::SynchronizeStream(Stream stream) {
  MutexLock l(&mu_);
  Count("SynchronizeStream");
  return CompleteLocked(stream);
}

absl::StatusOr<bool> HostBackend::QueryStream(Stream stream) {
  MutexLock l(&mu_);
  Count("QueryStream");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  Settle(**st);
  return (*st)->completed >= (*st)->submitted;
}

absl::Status HostBackend::LaunchHostFunction(Stream stream, absl::AnyInvocable<void() &&> fn) {
  MutexLock l(&mu_);
  Count("LaunchHostFunction");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  (*st)->host_functions.emplace(++(*st)->submitted, std::move(fn));
  Advance(**st);
  Settle(**st);
  return absl::OkStatus();
}

absl::StatusOr<bool> HostBackend::IsCapturing(Stream stream) {
  MutexLock l(&mu_);
  Count("IsCapturing");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  return (*st)->capturing;
}

void HostBackend::Touch(const void* ptr, std::size_t bytes, int device) {
  MutexLock l(&mu_);
  auto a = FindManaged(const_cast<void*>(ptr), bytes);
  if (!a.ok() || !(*a)->reserved || !CheckDevice(device).ok()) return;
  auto it = --managed_.upper_bound(reinterpret_cast<std::uintptr_t>(ptr));
  PopulatePages(it->second, it->first, {const_cast<void*>(ptr), bytes},
                PlacementRecord::Op::kPrefetch, Location::Device(device));
}


absl::Status HostBackend::EnqueueWork(Stream stream) {
  MutexLock l(&mu_);
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  ++(*st)->submitted;
  Advance(**st);
  return absl::OkStatus();
}

absl::Status HostBackend::CompleteWork(Stream stream) {
  MutexLock l(&mu_);
  return CompleteLocked(stream);
}

absl::Status HostBackend::CompleteLocked(Stream stream) {
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  CompleteUpTo(stream, (*st)->submitted);
  return absl::OkStatus();
}

void HostBackend::CompleteUpTo(Stream stream, std::int64_t ticket, int depth) {
  auto st = streams_.find(stream);
  if (st == streams_.end() || st->second.completed >= ticket) return;
  StreamState& s = st->second;
  while (!s.waits.empty() && s.waits.begin()->first <= ticket) {
    const auto [on, on_ticket] = s.waits.begin()->second;
    s.waits.erase(s.waits.begin());
    // Waits refer to earlier positions, so this ends; the bound is a guard.
    if (depth < 64) CompleteUpTo(on, on_ticket, depth + 1);
  }
  s.completed = std::max(s.completed, ticket);
  RunCompletedHostFunctions(s);
}

void HostBackend::Settle(StreamState& s, int depth) {
  while (s.completed < s.submitted) {
    const std::int64_t unit = s.completed + 1;
    if (s.host_functions.count(unit) != 0) {  // nothing to wait for but what came before
      ++s.completed;
      RunCompletedHostFunctions(s);
      continue;
    }
    auto w = s.waits.find(unit);
    if (w == s.waits.end()) return;  // ordinary work: CompleteWork finishes it
    const auto [on_stream, ticket] = w->second;
    auto on = streams_.find(on_stream);
    if (on != streams_.end() && on->second.completed < ticket) {
      // Two streams may wait on each other's earlier positions: the bound
      // guards the recursion, which may also settle `s` itself.
      if (depth < 64) Settle(on->second, depth + 1);
      on = streams_.find(on_stream);
      if (on != streams_.end() && on->second.completed < ticket) return;
    }
    if (s.completed + 1 == unit) {
      s.waits.erase(unit);
      ++s.completed;
      RunCompletedHostFunctions(s);
    }
  }
}

HostBackend::StreamState* HostBackend::Settled(Stream stream) {
  auto st = streams_.find(stream);
  if (st == streams_.end()) return nullptr;
  Settle(st->second);
  return &st->second;
}

std::int64_t HostBackend::PendingWork(Stream stream) {
  MutexLock l(&mu_);
  StreamState* st = Settled(stream);
  return st != nullptr ? st->submitted - st->completed : 0;
}

absl::StatusOr<Event> HostBackend::CreateEvent(int device) {
  MutexLock l(&mu_);
  Count("CreateEvent");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  const Event id = next_id_++;
  events_[id] = EventState{device};
  return id;
}

absl::Status HostBackend::DestroyEvent(Event event) {
  MutexLock l(&mu_);
  Count("DestroyEvent");
  if (!events_.erase(event)) {
    return absl::InvalidArgumentError(absl::StrFormat("DestroyEvent: unknown event 0x%x", event));
  }
  return absl::OkStatus();
}

absl::Status HostBackend::RecordEvent(Event event, Stream stream) {
  MutexLock l(&mu_);
  Count("RecordEvent");
  auto it = events_.find(event);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("RecordEvent: unknown event 0x%x", event));
  }
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  it->second.stream = stream;
  it->second.ticket = (*st)->submitted;
  it->second.recorded = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> HostBackend::QueryEvent(Event event) {
  MutexLock l(&mu_);
  Count("QueryEvent");
  auto it = events_.find(event);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(absl::StrFormat("QueryEvent: unknown event 0x%x", event));
  }
  if (!it->second.recorded) return true;  // as CUDA: an unrecorded event is complete
  StreamState* st = Settled(it->second.stream);
  // A destroyed stream's work is considered finished.
  return st == nullptr || st->completed >= it->second.ticket;
}

absl::Status HostBackend::SynchronizeEvent(Event event) {
  MutexLock l(&mu_);
  Count("SynchronizeEvent");
  auto it = events_.find(event);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SynchronizeEvent: unknown event 0x%x", event));
  }
  // The "device" finishes that work.
  if (it->second.recorded) CompleteUpTo(it->second.stream, it->second.ticket);
  return absl::OkStatus();
}

absl::Status HostBackend::StreamWaitEvent(Stream stream, Event event) {
  MutexLock l(&mu_);
  Count("StreamWaitEvent");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  auto ev = events_.find(event);
  if (ev == events_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("StreamWaitEvent: unknown event 0x%x", event));
  }
  if (!ev->second.recorded) return absl::OkStatus();
  waits_.push_back({stream, ev->second.stream, ev->second.ticket, ++record_seq_});
  // Work queued on `stream` from now on completes only after the event's:
  // a unit of its own that the other stream's progress completes.
  StreamState* on = Settled(ev->second.stream);
  if (on != nullptr && on->completed < ev->second.ticket && ev->second.stream != stream) {
    StreamState& s = **st;
    s.waits[++s.submitted] = {ev->second.stream, ev->second.ticket};
    Advance(s);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- introspection

HostResourceCounts HostBackend::LiveResources() const {
  HostResourceCounts c;
  c.shmem_allocations = ShmemLiveAllocations();
  MutexLock l(&mu_);
  c.managed_allocations = static_cast<int>(managed_.size());
  for (auto& [p, a] : managed_) c.managed_bytes += a.bytes;
  c.streams = static_cast<int>(streams_.size()) - 1;  // the default stream always exists
  c.events = static_cast<int>(events_.size());
  c.physical_handles = static_cast<int>(physical_.size());
  c.reservations = static_cast<int>(reservations_.size());
  c.mappings = static_cast<int>(mappings_.size());
  c.multicast_objects = static_cast<int>(multicast_.size());
  c.pinned_allocations = static_cast<int>(pinned_.size());
  c.pinned_bytes = pinned_bytes_;
  for (const auto& [h, comm] : comms_) c.comm_windows += static_cast<int>(comm.windows.size());
  return c;
}

std::int64_t HostBackend::CallCount(const std::string& method) const {
  MutexLock l(&mu_);
  auto it = calls_.find(method);
  return it == calls_.end() ? 0 : it->second;
}

std::int64_t HostBackend::TotalCalls() const {
  MutexLock l(&mu_);
  std::int64_t n = 0;
  for (auto& [k, v] : calls_) n += v;
  return n;
}

}  // namespace cma
