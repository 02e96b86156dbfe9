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
