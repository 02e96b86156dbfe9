// HostBackend's virtual memory management and multicast emulation: physical
// memory is a memfd, reservations are PROT_NONE mappings, exported handles are
// dup'ed FDs that cross processes with SCM_RIGHTS. The memfd's size is sealed
// once set, so that no holder of an exported FD can shrink it under another
// process's mappings (which would turn their accesses into SIGBUS), and an
// import accepts only such a memfd.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_format.h"
#include "backends/host/host_backend.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

absl::Status Errno(const char* call) {
  return absl::InternalError(absl::StrFormat("%s failed: %s", call, std::strerror(errno)));
}

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older C libraries lack the name
#endif

constexpr char kMemfdName[] = "cma-vmm";
constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// What an imported descriptor must be: a memfd of ours (by its name) whose
// size is sealed, of `bytes` bytes (when the exporter said). kInvalidArgument
// naming what it is instead: a regular file, a pipe, a memfd another program
// made, one that could still shrink.
absl::Status CheckImported(int fd, const struct stat& st, std::size_t bytes,
                           std::size_t granularity) {
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d is not memory (file type %#o): the host backend exports memfds",
        fd, st.st_mode & S_IFMT));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d is a file, not a memfd (F_GET_SEALS: %s)", fd,
        std::strerror(errno)));
  }
  char link[64];
  char target[256] = {};
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  const std::string expected = absl::StrFormat("/memfd:%s ", kMemfdName);  // then "(deleted)"
  if (n < 0 || std::strncmp(target, expected.c_str(), expected.size()) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d (%s) is not a memfd made by the host backend (%s)", fd,
        n < 0 ? "unnamed" : target, expected + "(deleted)"));
  }
  if ((seals & kSizeSeals) != kSizeSeals) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d is a memfd whose size is not sealed (seals %#x): its holders "
        "could shrink it under our mappings",
        fd, seals));
  }
  // Symmetric memory is mapped writable: a write seal would only surface
  // later, as a failed mprotect, with nothing to say why.
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d is a memfd sealed against writing (%s; seals %#x): it cannot "
        "be mapped writable, which symmetric memory must be",
        fd, (seals & F_SEAL_WRITE) != 0 ? "F_SEAL_WRITE" : "F_SEAL_FUTURE_WRITE", seals));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0 || size % granularity != 0 || (bytes != 0 && size != bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d holds %d bytes; expected %d (a multiple of the granularity %d)",
        fd, size, bytes, granularity));
  }
  return absl::OkStatus();
}

bool Overlaps(std::uintptr_t a, std::size_t an, std::uintptr_t b, std::size_t bn) {
  return a < b + bn && b < a + an;
}

}  // namespace

// ---------------------------------------------------------------- VMM

absl::StatusOr<std::size_t> HostBackend::VmmGranularity(int device) {
  MutexLock l(&mu_);
  Count("VmmGranularity");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  return options_.vmm_granularity;
}

absl::StatusOr<PhysicalHandle> HostBackend::VmmCreate(int device, std::size_t bytes,
                                                      HandleType exportable) {
  MutexLock l(&mu_);
  Count("VmmCreate");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  if (bytes == 0 || bytes % options_.vmm_granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmCreate: %d bytes is not a positive multiple of the granularity %d", bytes,
        options_.vmm_granularity));
  }
  if (exportable == HandleType::kFabric && !options_.fabric_handles) {
    return absl::UnimplementedError("VmmCreate: fabric handles are not supported on this device");
  }
  if (used_[device] + bytes > capacity_[device]) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("VmmCreate: out of memory on device %d", device));
  }
  const int fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, kSizeSeals) != 0) {
    const absl::Status s = Errno("ftruncate or F_ADD_SEALS");
    close(fd);
    return s;
  }
  used_[device] += bytes;
  const PhysicalHandle h = next_id_++;
  physical_[h] = PhysicalMemory{fd, bytes, device};
  return h;
}

absl::Status HostBackend::VmmRelease(PhysicalHandle handle) {
  MutexLock l(&mu_);
  Count("VmmRelease");
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.fd < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("VmmRelease: unknown handle %d", handle));
  }
  // As with CUDA, mappings keep the memory alive; the handle goes now.
  close(it->second.fd);
  it->second.fd = -1;
  if (it->second.maps == 0) DropPhysical(it);
  return absl::OkStatus();
}

absl::StatusOr<void*> HostBackend::VmmReserve(std::size_t bytes, std::size_t alignment) {
  MutexLock l(&mu_);
  Count("VmmReserve");
  if (bytes == 0 || bytes % options_.vmm_granularity != 0) {
    return absl::InvalidArgumentError("VmmReserve: size must be a positive multiple of granularity");
  }
  const std::size_t align = alignment ? alignment : options_.vmm_granularity;
  void* raw = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
  if (raw == MAP_FAILED) return Errno("mmap(reserve)");
  // Trim to an aligned range.
  auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + align - 1) / align * align;
  if (aligned > base) munmap(raw, aligned - base);
  const std::uintptr_t tail = aligned + bytes;
  if (base + bytes + align > tail) munmap(reinterpret_cast<void*>(tail), base + bytes + align - tail);
  reservations_[aligned] = bytes;
  return reinterpret_cast<void*>(aligned);
}

absl::Status HostBackend::VmmFreeAddress(void* address, std::size_t bytes) {
  MutexLock l(&mu_);
  Count("VmmFreeAddress");
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  auto it = reservations_.find(a);
  if (it == reservations_.end() || it->second != bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("VmmFreeAddress: [%p, +%d) is not a reservation", address, bytes));
  }
  for (auto& [m, map] : mappings_) {
    if (Overlaps(m, map.bytes, a, bytes)) {
      return absl::FailedPreconditionError("VmmFreeAddress: range still has mappings");
    }
  }
  munmap(address, bytes);
  reservations_.erase(it);
  return absl::OkStatus();
}

absl::Status HostBackend::VmmMap(void* address, std::size_t bytes, PhysicalHandle handle) {
  MutexLock l(&mu_);
  Count("VmmMap");
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  auto ph = physical_.find(handle);
  if (ph == physical_.end() || ph->second.fd < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("VmmMap: unknown handle %d", handle));
  }
  if (bytes != ph->second.bytes) {
    return absl::InvalidArgumentError("VmmMap: size must equal the physical allocation's size");
  }
  auto r = reservations_.upper_bound(a);
  if (r == reservations_.begin() || (--r, a + bytes > r->first + r->second)) {
    return absl::InvalidArgumentError("VmmMap: range is not inside a reservation");
  }
  for (auto& [m, map] : mappings_) {
    if (Overlaps(m, map.bytes, a, bytes)) {
      return absl::InvalidArgumentError("VmmMap: range is already mapped");
    }
  }
  void* p = mmap(address, bytes, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->second.fd, 0);
  if (p == MAP_FAILED) return Errno("mmap(map)");
  mappings_[a] = Mapping{bytes, handle};
  ++ph->second.maps;
  return absl::OkStatus();
}

absl::Status HostBackend::VmmUnmap(void* address, std::size_t bytes) {
  MutexLock l(&mu_);
  Count("VmmUnmap");
  auto it = mappings_.find(reinterpret_cast<std::uintptr_t>(address));
  if (it == mappings_.end() || it->second.bytes != bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("VmmUnmap: [%p, +%d) is not a mapping", address, bytes));
  }
  // Put the reservation back to PROT_NONE anonymous memory.
  void* p = mmap(address, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return Errno("mmap(unmap)");
  auto ph = physical_.find(it->second.handle);
  if (ph != physical_.end() && --ph->second.maps == 0 && ph->second.fd < 0) DropPhysical(ph);
  mappings_.erase(it);
  return absl::OkStatus();
}

absl::Status HostBackend::VmmSetAccess(void* address, std::size_t bytes,
                                       absl::Span<const int> devices) {
  MutexLock l(&mu_);
  Count("VmmSetAccess");
  for (int d : devices) {
    if (auto s = CheckDevice(d); !s.ok()) return s;
  }
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  std::size_t covered = 0;
  for (auto& [m, map] : mappings_) {
    if (m >= a && m + map.bytes <= a + bytes) covered += map.bytes;
  }
  if (covered != bytes) {
    return absl::InvalidArgumentError("VmmSetAccess: range is not fully mapped");
  }
  if (mprotect(address, bytes, devices.empty() ? PROT_NONE : PROT_READ | PROT_WRITE) != 0) {
    return Errno("mprotect");
  }
  return absl::OkStatus();
}

void HostBackend::DropPhysical(
    absl::flat_hash_map<PhysicalHandle, PhysicalMemory>::iterator it) {
  if (it->second.device >= 0) used_[it->second.device] -= it->second.bytes;
  physical_.erase(it);
}

absl::StatusOr<ShareableHandle> HostBackend::VmmExport(PhysicalHandle handle, HandleType type) {
  MutexLock l(&mu_);
  Count("VmmExport");
  auto it = physical_.find(handle);
  if (it == physical_.end() || it->second.fd < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("VmmExport: unknown handle %d", handle));
  }
  if (type == HandleType::kFabric) {
    return absl::UnimplementedError("VmmExport: the host backend exports POSIX FDs only");
  }
  ShareableHandle out;
  out.type = HandleType::kPosixFd;
  out.fd = dup(it->second.fd);
  if (out.fd < 0) return Errno("dup");
  out.bytes = it->second.bytes;
  return out;
}

absl::StatusOr<PhysicalHandle> HostBackend::VmmImport(const ShareableHandle& shared) {
  MutexLock l(&mu_);
  Count("VmmImport");
  if (shared.type != HandleType::kPosixFd) {
    return absl::UnimplementedError("VmmImport: the host backend imports POSIX FDs only");
  }
  struct stat st;
  if (shared.fd < 0 || fstat(shared.fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("VmmImport: bad descriptor %d", shared.fd));
  }
  if (absl::Status s = CheckImported(shared.fd, st, shared.bytes, options_.vmm_granularity);
      !s.ok()) {
    return s;
  }
  const int fd = dup(shared.fd);
  if (fd < 0) return Errno("dup");
  const PhysicalHandle h = next_id_++;
  // Imported memory belongs to its exporter's device: it is not counted here.
  physical_[h] = PhysicalMemory{fd, static_cast<std::size_t>(st.st_size), -1};
  return h;
}

// ---------------------------------------------------------------- multicast

absl::StatusOr<MulticastHandle> HostBackend::MulticastCreate(absl::Span<const int> devices,
                                                             std::size_t bytes) {
  MutexLock l(&mu_);
  Count("MulticastCreate");
  if (!options_.multicast_supported) {
    return absl::UnimplementedError("MulticastCreate: multicast is not supported on this device");
  }
  if (bytes == 0 || bytes % options_.vmm_granularity != 0) {
    return absl::InvalidArgumentError("MulticastCreate: size must be a multiple of granularity");
  }
  for (int d : devices) {
    if (auto s = CheckDevice(d); !s.ok()) return s;
  }
  const MulticastHandle h = next_id_++;
  multicast_[h] = {};
  return h;
}

absl::Status HostBackend::MulticastAddDevice(MulticastHandle mc, int device) {
  MutexLock l(&mu_);
  Count("MulticastAddDevice");
  auto it = multicast_.find(mc);
  if (it == multicast_.end()) return absl::InvalidArgumentError("unknown multicast object");
  if (auto s = CheckDevice(device); !s.ok()) return s;
  it->second.push_back(device);
  return absl::OkStatus();
}

absl::Status HostBackend::MulticastBindMemory(MulticastHandle mc, std::size_t, PhysicalHandle mem,
                                              std::size_t, std::size_t) {
  MutexLock l(&mu_);
  Count("MulticastBindMemory");
  if (!multicast_.contains(mc)) return absl::InvalidArgumentError("unknown multicast object");
  if (!physical_.contains(mem)) return absl::InvalidArgumentError("unknown physical handle");
  return absl::OkStatus();
}

absl::Status HostBackend::MulticastRelease(MulticastHandle mc) {
  MutexLock l(&mu_);
  Count("MulticastRelease");
  if (!multicast_.erase(mc)) return absl::InvalidArgumentError("unknown multicast object");
  return absl::OkStatus();
}

}  // namespace cma
