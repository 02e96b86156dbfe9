// HostBackend's virtual memory management and multicast emulation: physical
// memory is a memfd, reservations are PROT_NONE mappings, exported handles are
// dup'ed FDs that cross processes with SCM_RIGHTS. The memfd's size is sealed
// once set, so that no holder of an exported FD can shrink it under another
// process's mappings (which would turn their accesses into SIGBUS), and an
// import accepts only such a memfd.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

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

// The emulated host's memfd name: "cma-vmm" on the default host (as
// before), "cma-vmm@<host>" on another.
std::string MemfdName(const std::string& host) {
  return host.empty() ? std::string(kMemfdName) : absl::StrCat(kMemfdName, "@", host);
}

// The host and domain ids: 0 to 16 (a domain: 1 to 16) of [A-Za-z0-9_.],
// so that names built from them cannot be read two ways.
bool ValidId(absl::string_view id, bool may_be_empty) {
  if (id.size() > 16 || (id.empty() && !may_be_empty)) return false;
  for (char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
          c == '_' || c == '.')) {
      return false;
    }
  }
  return true;
}

// An emulated fabric handle's 64 bytes: magic, version, the lengths of the
// domain and host ids, the ids (16 bytes each, zero-padded) and 16 random
// bytes; the rest zero. The shared-memory object's name is made of them.
constexpr std::uint32_t kFabricMagic = 0x434d4146;  // "CMAF"
constexpr unsigned char kFabricVersion = 1;
constexpr std::size_t kFabricRandom = 16;
struct FabricName {
  std::string domain, host, random;
  std::string Name() const {
    std::string hex;
    for (unsigned char c : random) absl::StrAppendFormat(&hex, "%02x", c);
    return absl::StrCat("/cma-fabric-", domain, "-", host, "-", hex);
  }
};
void EncodeFabric(const FabricName& f, unsigned char out[64]) {
  std::memset(out, 0, 64);
  std::memcpy(out, &kFabricMagic, 4);
  out[4] = kFabricVersion;
  out[5] = static_cast<unsigned char>(f.domain.size());
  out[6] = static_cast<unsigned char>(f.host.size());
  std::memcpy(out + 8, f.domain.data(), f.domain.size());
  std::memcpy(out + 24, f.host.data(), f.host.size());
  std::memcpy(out + 40, f.random.data(), kFabricRandom);
}
// Every byte checked: a handle from another process is hostile until shown.
absl::StatusOr<FabricName> DecodeFabric(const unsigned char in[64]) {
  std::uint32_t magic = 0;
  std::memcpy(&magic, in, 4);
  const std::size_t dl = in[5], hl = in[6];
  bool zeros = in[7] == 0;
  for (std::size_t i = 8 + dl; i < 24; ++i) zeros = zeros && i < 24 && in[i] == 0;
  for (std::size_t i = 24 + hl; i < 40; ++i) zeros = zeros && in[i] == 0;
  for (std::size_t i = 56; i < 64; ++i) zeros = zeros && in[i] == 0;
  FabricName f;
  if (magic == kFabricMagic && in[4] == kFabricVersion && dl <= 16 && hl <= 16 && zeros) {
    f.domain.assign(reinterpret_cast<const char*>(in + 8), dl);
    f.host.assign(reinterpret_cast<const char*>(in + 24), hl);
    f.random.assign(reinterpret_cast<const char*>(in + 40), kFabricRandom);
    if (ValidId(f.domain, false) && ValidId(f.host, true)) return f;
  }
  return absl::InvalidArgumentError(
      "VmmImport: the fabric handle is not one the host backend exports (bad magic, version, "
      "ids or padding)");
}

// A fabric object, opened by name or received as a descriptor: ours (this
// user's, 0600) and of `bytes` bytes (when the exporter said).
absl::Status CheckFabricObject(int fd, const struct stat& st, std::size_t bytes,
                               std::size_t granularity) {
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "VmmImport: fabric object (descriptor %d) is not a private object of this user (uid %d, "
        "mode %04o)",
        fd, st.st_uid, st.st_mode & 07777));
  }
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0 || size % granularity != 0 || (bytes != 0 && size != bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: fabric object (descriptor %d) holds %d bytes; expected %d (a multiple of "
        "the granularity %d)",
        fd, size, bytes, granularity));
  }
  return absl::OkStatus();
}

// What an imported descriptor must be: a memfd of ours (by its name) whose
// size is sealed, of `bytes` bytes (when the exporter said). kInvalidArgument
// naming what it is instead: a regular file, a pipe, a memfd another program
// made, one that could still shrink. kPermissionDenied for memory of
// another emulated host (or domain). A fabric object of this host, sent as
// a descriptor, passes CheckFabricObject.
absl::Status CheckImported(int fd, const struct stat& st, std::size_t bytes,
                           std::size_t granularity, const std::string& host,
                           const std::string& domain) {
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d is not memory (file type %#o): the host backend exports memfds",
        fd, st.st_mode & S_IFMT));
  }
  char link[64];
  char target[256] = {};
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n > 0 && absl::StartsWith(target, "/dev/shm/cma-fabric-")) {
    const std::string ours = absl::StrCat("/dev/shm/cma-fabric-", domain, "-", host, "-");
    if (domain.empty() || !absl::StartsWith(target, ours)) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "VmmImport: descriptor %d (%s) is a fabric object of another emulated host or domain "
          "(this process: host '%s', domain '%s')",
          fd, target, host, domain));
    }
    return CheckFabricObject(fd, st, bytes, granularity);
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "VmmImport: descriptor %d is a file, not a memfd (F_GET_SEALS: %s)", fd,
        std::strerror(errno)));
  }
  const std::string expected = absl::StrFormat("/memfd:%s ", MemfdName(host));  // then "(deleted)"
  if (n < 0 || std::strncmp(target, expected.c_str(), expected.size()) != 0) {
    const absl::string_view t(target);
    if (n > 0 && (absl::StartsWith(t, "/memfd:cma-vmm@") || absl::StartsWith(t, "/memfd:cma-vmm "))) {
      const std::size_t at = t.find('@');
      const std::string other =
          at == absl::string_view::npos ? "" : std::string(t.substr(at + 1, t.find(' ') - at - 1));
      return absl::PermissionDeniedError(absl::StrFormat(
          "VmmImport: descriptor %d was exported on emulated host '%s' but this process is on "
          "emulated host '%s': POSIX FDs (SCM_RIGHTS) serve the processes of one host only",
          fd, other, host));
    }
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

absl::Status HostBackend::CheckEmulatedIds() const {
  if (!ValidId(options_.host_id, true) ||
      !(options_.fabric_domain.empty() || ValidId(options_.fabric_domain, false))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host backend: the emulated host '%s' or fabric domain '%s' is not 1 to 16 of "
        "[A-Za-z0-9_.] (HostBackendOptions, CMA_HOST_EMULATED_HOST, CMA_HOST_FABRIC_DOMAIN)",
        options_.host_id, options_.fabric_domain));
  }
  return absl::OkStatus();
}

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
  if (auto s = CheckEmulatedIds(); !s.ok()) return s;
  if (exportable == HandleType::kFabric && !options_.fabric_domain.empty()) {
    // An emulated fabric allocation: a shared-memory object whose random
    // name is the handle, openable by name within the domain.
    FabricName f{options_.fabric_domain, options_.host_id, std::string(kFabricRandom, '\0')};
    if (getrandom(f.random.data(), kFabricRandom, 0) != static_cast<ssize_t>(kFabricRandom)) {
      return Errno("getrandom");
    }
    const std::string name = f.Name();
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return Errno("shm_open");
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const absl::Status s = Errno("fchmod or ftruncate (fabric object)");
      close(fd);
      shm_unlink(name.c_str());
      return s;
    }
    used_[device] += bytes;
    const PhysicalHandle h = next_id_++;
    physical_[h] = PhysicalMemory{fd, bytes, device, 0, name};
    return h;
  }
  const int fd = memfd_create(MemfdName(options_.host_id).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
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
  // As with CUDA, mappings keep the memory alive; the handle goes now (and
  // a fabric object's name: whoever imports it has opened it by now).
  close(it->second.fd);
  it->second.fd = -1;
  if (!it->second.shm_name.empty()) {
    shm_unlink(it->second.shm_name.c_str());
    it->second.shm_name.clear();
  }
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
  // A communicator window left over unmapped memory would alias whatever is
  // mapped there next (NCCL finds windows by address): refused, so that a
  // caller unmapping before deregistering is caught in tests.
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  for (const auto& [h, comm] : comms_) {
    for (const auto& [w, range] : comm.windows) {
      if (range.first < a + bytes && a < range.first + range.second) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "VmmUnmap: [%p, +%d) is under communicator window %#x: deregister it first",
            address, bytes, w));
      }
    }
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
    if (options_.fabric_domain.empty()) {
      return absl::UnimplementedError(
          "VmmExport: the host backend exports fabric handles only within an emulated NVLink "
          "domain (HostBackendOptions::fabric_domain, CMA_HOST_FABRIC_DOMAIN), and none is set");
    }
    if (it->second.shm_name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "VmmExport: handle %d was not created fabric-exportable", handle));
    }
    ShareableHandle out;
    out.type = HandleType::kFabric;
    FabricName f{options_.fabric_domain, options_.host_id, std::string(kFabricRandom, '\0')};
    const std::string hex = it->second.shm_name.substr(it->second.shm_name.size() - 2 * kFabricRandom);
    for (std::size_t i = 0; i < kFabricRandom; ++i) {
      f.random[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
    }
    EncodeFabric(f, out.fabric);
    out.bytes = it->second.bytes;
    return out;
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
  if (auto s = CheckEmulatedIds(); !s.ok()) return s;
  if (shared.type == HandleType::kFabric && options_.fabric_domain.empty()) {
    return absl::UnimplementedError(
        "VmmImport: the host backend imports POSIX FDs only, unless it emulates an NVLink "
        "domain (HostBackendOptions::fabric_domain, CMA_HOST_FABRIC_DOMAIN)");
  }
  if (shared.type == HandleType::kFabric) {
    absl::StatusOr<FabricName> f = DecodeFabric(shared.fabric);
    if (!f.ok()) return f.status();
    if (options_.fabric_domain.empty() || f->domain != options_.fabric_domain) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "VmmImport: a fabric handle of emulated NVLink domain '%s' cannot be opened in "
          "domain '%s'",
          f->domain, options_.fabric_domain));
    }
    const int fd = shm_open(f->Name().c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
      return absl::NotFoundError(absl::StrFormat(
          "VmmImport: fabric handle %s: %s (released by its exporter?)", f->Name(),
          std::strerror(errno)));
    }
    struct stat st;
    absl::Status s = fstat(fd, &st) == 0 ? CheckFabricObject(fd, st, shared.bytes,
                                                             options_.vmm_granularity)
                                         : Errno("fstat");
    if (!s.ok()) {
      close(fd);
      return s;
    }
    const PhysicalHandle h = next_id_++;
    physical_[h] = PhysicalMemory{fd, static_cast<std::size_t>(st.st_size), -1};
    return h;
  }
  struct stat st;
  if (shared.fd < 0 || fstat(shared.fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("VmmImport: bad descriptor %d", shared.fd));
  }
  if (absl::Status s = CheckImported(shared.fd, st, shared.bytes, options_.vmm_granularity,
                                     options_.host_id, options_.fabric_domain);
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
