// The symmetric heap's handles per pair across hosts (pair_handles.h).
#include "allocator/symmetric/pair_handles.h"

#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cma {
namespace symmetric_internal {
absl::Status ExportPerPair(Backend& backend, HandleType type, PhysicalHandle h, int rank,
                           StepClock& clock, Contribution& mine, std::vector<int>& fds_to_close) {
  ShareableHandle fabric;
  const bool has_fabric = type == HandleType::kFabric;
  if (has_fabric) {
    absl::StatusOr<ShareableHandle> sh =
        clock.Time("VmmExport", [&] { return backend.VmmExport(h, HandleType::kFabric); });
    if (!sh.ok()) return sh.status();
    fabric = *sh;
  }
  absl::StatusOr<ShareableHandle> fd =
      clock.Time("VmmExport", [&] { return backend.VmmExport(h, HandleType::kPosixFd); });
  const bool has_fd = fd.ok() && fd->fd >= 0;
  if (has_fd) {
    mine.fds.push_back(fd->fd);
    fds_to_close.push_back(fd->fd);
  } else if (!has_fabric) {
    return fd.ok() ? absl::InternalError("symmetric heap: a POSIX FD export gave no descriptor")
                   : fd.status();
  }
  Put(mine.bytes, static_cast<std::int32_t>(rank));
  Put(mine.bytes, static_cast<std::uint8_t>(has_fd));
  Put(mine.bytes, static_cast<std::uint8_t>(has_fabric));
  mine.bytes.append(reinterpret_cast<const char*>(fabric.fabric), sizeof(fabric.fabric));
  return absl::OkStatus();
}

absl::Status ImportPerPair(const PairView& v, const Contribution& c, int p, std::size_t pos,
                           std::uint32_t n, StepClock& clock, std::vector<PhysicalHandle>& handles,
                           std::vector<bool>& have, std::vector<bool>& unreachable,
                           std::vector<std::string>& why) {
  const auto malformed = [&] {
    return absl::DataLossError(absl::StrCat("symmetric heap: bad handle list from process ", p));
  };
  std::uint8_t dl = 0;
  if (!Get(c.bytes, pos, dl) || dl > 64 || c.bytes.size() - pos < dl) return malformed();
  const std::string domain = c.bytes.substr(pos, dl);
  pos += dl;
  const int my_host = v.exchange.host_of(v.exchange.process_index());
  const int their_host = v.exchange.host_of(p);
  const bool same_host = my_host == their_host;
  std::size_t next_fd = 0;
  for (std::uint32_t k = 0; k < n; ++k) {
    std::int32_t r = -1;
    std::uint8_t has_fd = 0, has_fabric = 0;
    ShareableHandle sh;
    sh.bytes = v.stride;
    if (!Get(c.bytes, pos, r) || !Get(c.bytes, pos, has_fd) || !Get(c.bytes, pos, has_fabric) ||
        has_fd > 1 || has_fabric > 1 || (has_fd == 0 && has_fabric == 0) ||
        c.bytes.size() - pos < sizeof(sh.fabric) || r < 0 || r >= v.world || have[r] ||
        unreachable[r]) {
      return malformed();
    }
    std::memcpy(sh.fabric, c.bytes.data() + pos, sizeof(sh.fabric));
    pos += sizeof(sh.fabric);
    if (same_host && has_fd) {
      if (next_fd >= c.fds.size()) {
        return absl::DataLossError(absl::StrCat("symmetric heap: process ", p, " sent too few FDs"));
      }
      sh.type = HandleType::kPosixFd;
      sh.fd = c.fds[next_fd++];
    } else if (has_fabric && (same_host || (!domain.empty() && domain == v.fabric_domain))) {
      sh.type = HandleType::kFabric;
    } else {
      unreachable[r] = true;
      why.push_back(absl::StrFormat(
          "member %d (process %d, host %d, %s) from this process (host %d, %s)", r, p, their_host,
          has_fabric ? absl::StrCat("NVLink domain '", domain, "'")
                     : std::string("no fabric handle"),
          my_host,
          v.fabric_domain.empty() ? std::string("no NVLink domain")
                                  : absl::StrCat("NVLink domain '", v.fabric_domain, "'")));
      continue;
    }
    absl::StatusOr<PhysicalHandle> h = clock.Time("VmmImport", [&] { return v.backend.VmmImport(sh); });
    if (!h.ok()) {
      return absl::Status(h.status().code(), absl::StrCat("symmetric heap: importing member ", r,
                                                          "'s handle from process ", p, ": ",
                                                          h.status().message()));
    }
    handles[r] = *h;
    have[r] = true;
  }
  if (pos != c.bytes.size()) return malformed();
  return absl::OkStatus();
}

}  // namespace symmetric_internal
}  // namespace cma
