// HostBackend's pinned host memory and stream-ordered copies (the sleep
// staging): pinned memory is anonymous mmap counted against a capacity, and a
// copy runs at once and is recorded with its stream's ticket, as every
// placement here is.
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "backends/host/host_backend.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

constexpr std::size_t kHostPage = std::size_t{2} << 20;  // as host_managed.cc's

}  // namespace

absl::StatusOr<void*> HostBackend::AllocatePinnedHost(std::size_t bytes) {
  MutexLock l(&mu_);
  Count("AllocatePinnedHost");
  if (bytes == 0) return absl::InvalidArgumentError("AllocatePinnedHost: size 0");
  if (bytes > options_.pinned_capacity - pinned_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "AllocatePinnedHost: %d bytes requested, %d of %d pinned bytes in use", bytes,
        pinned_bytes_, options_.pinned_capacity));
  }
  void* p = MAP_FAILED;
  if (options_.pinned_back_to_back) {
    if (pinned_region_ == nullptr) {
      void* r = mmap(nullptr, options_.pinned_capacity, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (r != MAP_FAILED) pinned_region_ = static_cast<char*>(r);
    }
    const std::size_t len = (bytes + 4095) / 4096 * 4096;
    if (pinned_region_ != nullptr && len <= options_.pinned_capacity - pinned_region_used_) {
      p = mmap(pinned_region_ + pinned_region_used_, bytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p != MAP_FAILED) pinned_region_used_ += len;  // freed space is not reused
    }
  } else {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("AllocatePinnedHost: mmap failed: ", std::strerror(errno)));
  }
  pinned_[reinterpret_cast<std::uintptr_t>(p)] = bytes;
  pinned_bytes_ += bytes;
  return p;
}

absl::Status HostBackend::FreePinnedHost(void* ptr) {
  MutexLock l(&mu_);
  Count("FreePinnedHost");
  auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == pinned_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FreePinnedHost: %p is not pinned memory from AllocatePinnedHost", ptr));
  }
  if (pinned_region_ != nullptr) {
    // Back to the reservation (which the destructor unmaps whole).
    mmap(ptr, it->second, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  } else {
    munmap(ptr, it->second);
  }
  pinned_bytes_ -= it->second;
  pinned_.erase(it);
  return absl::OkStatus();
}

bool HostBackend::InPinned(const void* p, std::size_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return false;
  --it;
  return a >= it->first && bytes <= it->second && a - it->first <= it->second - bytes;
}

absl::Status HostBackend::CopyBatch(absl::Span<const Copy> copies, Stream stream) {
  MutexLock l(&mu_);
  Count("CopyBatch");
  auto st = FindStream(stream);
  if (!st.ok()) return st.status();
  // All checked before any runs: a bad batch copies nothing.
  for (const Copy& c : copies) {
    for (const auto& [p, side] : {std::pair<const void*, const char*>{c.dst, "destination"},
                                  std::pair<const void*, const char*>{c.src, "source"}}) {
      const bool known = InPinned(p, c.bytes) || FindManaged(const_cast<void*>(p), c.bytes).ok();
      if (c.bytes == 0 || !known) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "CopyBatch: %s %p (+%d) is not inside one managed allocation or pinned buffer", side,
            p, c.bytes));
      }
    }
  }
  for (const Copy& c : copies) {
    if (!InPinned(c.dst, c.bytes)) {
      auto it = --managed_.upper_bound(reinterpret_cast<std::uintptr_t>(c.dst));
      if (it->second.reserved) {
        const int d = (*st)->device >= 0 ? (*st)->device : it->second.device;
        // Only pages that hold nothing: pages elsewhere are written in place.
        const auto lo = reinterpret_cast<std::uintptr_t>(c.dst) - it->first;
        for (std::size_t p = lo / kHostPage; p <= (lo + c.bytes - 1) / kHostPage; ++p) {
          if (it->second.page_device[p] != kPageUnpopulated) continue;
          it->second.page_device[p] = d;
          used_[d] += kHostPage;
        }
      }
    }
    std::memmove(c.dst, c.src, c.bytes);
    PlacementRecord r{PlacementRecord::Op::kCopy, c.dst, c.bytes, Advice::kSetReadMostly,
                      Location::Host(), stream, copies.size() > 1};
    r.src = c.src;
    Record(r);
  }
  return absl::OkStatus();
}

}  // namespace cma
