// The host backend's emulated communicators and their windows
// (host_backend.h: MakeEmulatedComm, RegisterCommWindow).
#include <cstdint>
#include <iterator>

#include "absl/strings/str_format.h"
#include "backends/host/host_backend.h"
#include "backends/mutex_lock.h"

namespace cma {

CommHandle HostBackend::MakeEmulatedComm(int rank, int size, int device, bool windows_supported) {
  MutexLock l(&mu_);
  const CommHandle h = next_id_++;
  EmulatedComm& c = comms_[h];
  c.facts = {rank, size, device};
  c.windows_supported = windows_supported;
  return h;
}

void HostBackend::DestroyEmulatedComm(CommHandle comm) {
  MutexLock l(&mu_);
  comms_.erase(comm);
}

absl::StatusOr<CommFacts> HostBackend::GetCommFacts(CommHandle comm) {
  MutexLock l(&mu_);
  Count("GetCommFacts");
  auto it = comms_.find(comm);
  if (it == comms_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host backend: %#x is not a live communicator", comm));
  }
  return it->second.facts;
}

absl::StatusOr<CommWindow> HostBackend::RegisterCommWindow(CommHandle comm, void* ptr,
                                                           std::size_t bytes) {
  MutexLock l(&mu_);
  Count("RegisterCommWindow");
  auto it = comms_.find(comm);
  if (it == comms_.end()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("host backend: RegisterCommWindow: %#x is not a live communicator", comm));
  }
  // As NCCL: the window lies in one physical allocation mapped here, at an
  // offset aligned to 4096 (NCCL_WIN_REQUIRED_ALIGNMENT).
  const auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto m = mappings_.upper_bound(p);
  if (bytes == 0 || m == mappings_.begin() ||
      p + bytes > std::prev(m)->first + std::prev(m)->second.bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host backend: RegisterCommWindow: [%p, +%d) is not inside one VMM mapping", ptr, bytes));
  }
  if ((p - std::prev(m)->first) % 4096 != 0) {
    return absl::InvalidArgumentError(
        "host backend: RegisterCommWindow: the window's offset in its mapping is not aligned "
        "to 4096");
  }
  if (!it->second.windows_supported) return CommWindow{0};
  const CommWindow w = next_id_++;
  it->second.windows[w] = {p, bytes};
  return w;
}

absl::Status HostBackend::DeregisterCommWindow(CommHandle comm, CommWindow window) {
  MutexLock l(&mu_);
  Count("DeregisterCommWindow");
  auto it = comms_.find(comm);
  if (it == comms_.end() || it->second.windows.erase(window) == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "host backend: DeregisterCommWindow: %#x is not a window of a live communicator",
        window));
  }
  return absl::OkStatus();
}

}  // namespace cma
