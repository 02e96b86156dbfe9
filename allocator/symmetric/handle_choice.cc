#include "allocator/symmetric/handle_choice.h"

#include <unistd.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cma {
namespace {

// Empty when `device` exports fabric handles (its probe allocation made,
// exported and released); otherwise why not. A failed release is an error
// of its own (the probe's memory would be lost).
absl::StatusOr<std::string> FabricProbe(Backend& backend, int device, std::size_t granularity) {
  absl::StatusOr<DeviceFacts> f = backend.GetDeviceFacts(device);
  if (!f.ok()) return f.status();
  if (!f->fabric_handles) {
    return absl::StrCat("device ", device, " reports no fabric handle support");
  }
  absl::StatusOr<PhysicalHandle> h = backend.VmmCreate(device, granularity, HandleType::kFabric);
  if (!h.ok()) {
    return absl::StrCat("device ", device, ": a fabric-exportable allocation failed: ",
                        h.status().message());
  }
  std::string why;
  absl::StatusOr<ShareableHandle> sh = backend.VmmExport(*h, HandleType::kFabric);
  if (!sh.ok()) {
    why = absl::StrCat("device ", device, ": exporting a fabric handle failed: ",
                       sh.status().message());
  } else if (sh->fd >= 0) {
    close(sh->fd);
  }
  if (absl::Status s = backend.VmmRelease(*h); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("symmetric heap: releasing the fabric probe on "
                                               "device ", device, ": ", s.message()));
  }
  return why;
}

}  // namespace

absl::StatusOr<HandleChoice> ChooseHandleType(Backend& backend, absl::Span<const int> devices,
                                              HandleType wanted, bool fabric_fallback,
                                              std::size_t granularity) {
  HandleChoice choice;
  choice.type = wanted;
  if (wanted != HandleType::kFabric) return choice;
  std::string why;
  for (int d : devices) {
    absl::StatusOr<std::string> probe = FabricProbe(backend, d, granularity);
    if (!probe.ok()) return probe.status();
    if (!probe->empty()) {
      why = *probe;
      break;
    }
  }
  if (why.empty()) return choice;
  if (!fabric_fallback) {
    return absl::UnimplementedError(absl::StrCat(
        "symmetric heap: fabric handles asked for, but ", why,
        " (SymmetricOptions::fabric_fallback uses POSIX FDs instead, on one host)"));
  }
  for (int d : devices) {
    absl::StatusOr<DeviceFacts> f = backend.GetDeviceFacts(d);
    if (!f.ok()) return f.status();
    if (!f->posix_fd_handles) {
      return absl::UnimplementedError(absl::StrCat(
          "symmetric heap: fabric handles asked for, but ", why, "; and device ", d,
          " cannot export POSIX FD handles to fall back to"));
    }
  }
  choice.type = HandleType::kPosixFd;
  choice.fallback_reason = why;
  return choice;
}

}  // namespace cma
