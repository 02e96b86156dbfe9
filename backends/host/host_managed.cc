// HostBackend's managed memory and placement: reservations are anonymous
// mmaps whose 2 MiB pages are counted against a device domain as they are
// populated; every advise, prefetch and discard is recorded for tests.
#include "backends/mutex_lock.h"
#include "backends/host/host_backend.h"

#include <algorithm>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace cma
