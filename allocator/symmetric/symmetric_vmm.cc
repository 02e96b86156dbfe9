// The symmetric heap's VMM provider: building an allocation from the
// Backend's VMM calls (each member's physical memory exported, imported by
// every other process, mapped into one reservation), and destroying one.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/symmetric/pair_handles.h"
#include "allocator/symmetric/symmetric_heap.h"

namespace cma {

using symmetric_internal::ExportPerPair;
using symmetric_internal::ImportPerPair;
using symmetric_internal::StepClock;

absl::StatusOr<std::unique_ptr<SymmetricHeap::Entry>> SymmetricHeap::BuildVmm(std::size_t bytes,
                                                                               std::size_t stride) {
  const int world = group_.world_size;
  const bool multi_process = exchange_->process_count() > 1;
  StepClock clock(miss_seconds_);
  auto e = std::make_unique<Entry>();
  SymmetricAllocation& a = e->a;
  // Taken first, so that ids stay in step on every member even when a build
  // fails (every member then fails it too: see the rounds below).
  a.id = next_id_++;
  std::vector<PhysicalHandle> handles(world, 0);
  std::vector<bool> have(world, false);
  std::vector<int> fds_to_close;
  std::vector<bool> mapped(world, false);
  // Across hosts (exchange_->host_count() > 1), each pair is served as it
  // can be: FDs within a host, fabric handles within an NVLink domain; a
  // member reachable by neither gets no mapping here (peers[r] null).
  const bool multi_host = multi_process && exchange_->host_count() > 1;
  std::vector<bool> unreachable(world, false);
  std::vector<std::string> unreachable_why;
  // Undo everything done so far: one exit path for every failure.
  auto fail = [&](absl::Status s) -> absl::Status {
    for (int r = 0; r < world; ++r) {
      if (mapped[r]) (void)backend_.VmmUnmap(static_cast<char*>(a.base) + r * stride, stride);
    }
    if (a.base != nullptr) (void)backend_.VmmFreeAddress(a.base, world * stride);
    for (int r = 0; r < world; ++r) {
      if (have[r]) (void)backend_.VmmRelease(handles[r]);
    }
    for (int fd : fds_to_close) close(fd);
    if (a.multicast) (void)backend_.MulticastRelease(a.multicast_handle);
    if (a.device_peers != nullptr) (void)backend_.FreeManaged(a.device_peers);
    return s;
  };

  // 1. This process's members' physical memory, exported for the others
  // (the process made non-dumpable first, when asked: nothing is mapped yet).
  absl::Status local = HoldNonDumpable();
  Contribution mine;
  symmetric_internal::Put(mine.bytes, static_cast<std::uint32_t>(group_.local_ranks.size()));
  // This process's handle type (a fabric heap may have fallen back to FDs);
  // across hosts, 2: a handle per pair, and this process's fabric domain.
  symmetric_internal::Put(mine.bytes, static_cast<std::uint32_t>(multi_host ? 2 : handle_type_ == HandleType::kFabric ? 1 : 0));
  if (multi_host) {
    symmetric_internal::Put(mine.bytes, static_cast<std::uint8_t>(fabric_domain_.size()));
    mine.bytes += fabric_domain_;
  }
  for (std::size_t i = 0; i < group_.local_ranks.size() && local.ok(); ++i) {
    const int r = group_.local_ranks[i];
    absl::StatusOr<PhysicalHandle> h = clock.Time("VmmCreate", [&] {
      return backend_.VmmCreate(group_.local_devices[i], stride, handle_type_);
    });
    if (!h.ok()) {
      local = h.status();
      break;
    }
    handles[r] = *h;
    have[r] = true;
    e->own_bytes += stride;
    if (!multi_process) continue;
    if (multi_host) {
      local = ExportPerPair(backend_, handle_type_, handles[r], r, clock, mine, fds_to_close);
      if (!local.ok()) break;
      continue;
    }
    absl::StatusOr<ShareableHandle> sh =
        clock.Time("VmmExport", [&] { return backend_.VmmExport(handles[r], handle_type_); });
    if (!sh.ok()) {
      local = sh.status();
      break;
    }
    symmetric_internal::Put(mine.bytes, static_cast<std::int32_t>(r));
    mine.bytes.append(reinterpret_cast<const char*>(sh->fabric), sizeof(sh->fabric));
    if (sh->fd >= 0) {
      mine.fds.push_back(sh->fd);
      fds_to_close.push_back(sh->fd);
    }
  }
  if (!multi_process && !local.ok()) return fail(local);

  // 2. Everyone else's, through the exchange. A process whose step 1 failed
  // still joins the round, with its reason, so that every member fails now,
  // naming it, rather than wait out the timeout.
  if (multi_process) {
    absl::StatusOr<std::vector<Contribution>> all =
        clock.Time("exchange", [&] { return Round(Op::kHandles, local, std::move(mine)); });
    if (!all.ok()) return fail(all.status());
    for (Contribution& c : *all) fds_to_close.insert(fds_to_close.end(), c.fds.begin(), c.fds.end());
    for (std::size_t p = 0; p < all->size() && local.ok(); ++p) {
      if (static_cast<int>(p) == exchange_->process_index()) continue;
      const Contribution& c = (*all)[p];
      std::size_t pos = 0;
      std::uint32_t n = 0;
      std::uint32_t type = 0;
      if (!symmetric_internal::Get(c.bytes, pos, n) || !symmetric_internal::Get(c.bytes, pos, type) || type > 2 ||
          (type == 2) != multi_host) {
        local = absl::DataLossError(absl::StrCat("symmetric heap: malformed handles from process ", p));
        break;
      }
      if (type == 2) {
        local = ImportPerPair({backend_, *exchange_, fabric_domain_, world, stride}, c,
                              static_cast<int>(p), pos, n, clock, handles, have, unreachable,
                              unreachable_why);
        continue;
      }
      const HandleType sent = type == 1 ? HandleType::kFabric : HandleType::kPosixFd;
      for (std::uint32_t k = 0; k < n && local.ok(); ++k) {
        std::int32_t r = -1;
        ShareableHandle sh;
        sh.type = sent;
        sh.bytes = stride;
        if (!symmetric_internal::Get(c.bytes, pos, r) || pos + sizeof(sh.fabric) > c.bytes.size() || r < 0 ||
            r >= world || have[r]) {
          local = absl::DataLossError(absl::StrCat("symmetric heap: bad handle list from process ", p));
          break;
        }
        std::memcpy(sh.fabric, c.bytes.data() + pos, sizeof(sh.fabric));
        pos += sizeof(sh.fabric);
        if (sent == HandleType::kPosixFd) {
          if (k >= c.fds.size()) {
            local = absl::DataLossError(absl::StrCat("symmetric heap: process ", p, " sent too few FDs"));
            break;
          }
          sh.fd = c.fds[k];
        }
        absl::StatusOr<PhysicalHandle> h =
            clock.Time("VmmImport", [&] { return backend_.VmmImport(sh); });
        if (!h.ok()) {
          local = h.status();
          break;
        }
        handles[r] = *h;
        have[r] = true;
      }
    }
  }
  for (int r = 0; r < world && local.ok(); ++r) {
    if (!have[r] && !unreachable[r]) {
      local = absl::FailedPreconditionError(
          absl::StrFormat("symmetric heap: no process contributed member %d of %d", r, world));
    }
  }

  // 3. One reservation, every member mapped, one access call for all local devices.
  if (local.ok()) {
    absl::StatusOr<void*> base =
        clock.Time("VmmReserve", [&] { return backend_.VmmReserve(world * stride, granularity_); });
    if (base.ok()) {
      a.base = *base;
    } else {
      local = base.status();
    }
  }
  for (int r = 0; r < world && local.ok(); ++r) {
    if (unreachable[r]) continue;
    local = clock.Time("VmmMap", [&] {
      return backend_.VmmMap(static_cast<char*>(a.base) + r * stride, stride, handles[r]);
    });
    if (local.ok()) mapped[r] = true;
  }
  const bool every_member = std::find(unreachable.begin(), unreachable.end(), true) == unreachable.end();
  if (local.ok() && every_member) {
    local = clock.Time("VmmSetAccess", [&] {
      return backend_.VmmSetAccess(a.base, world * stride, group_.local_devices);
    });
  }
  for (int r = 0; r < world && local.ok() && !every_member; ++r) {
    if (!mapped[r]) continue;
    local = clock.Time("VmmSetAccess", [&] {
      return backend_.VmmSetAccess(static_cast<char*>(a.base) + r * stride, stride,
                                   group_.local_devices);
    });
  }

  // 4. Multicast: guarded opt-in, bound before the handles go.
  if (local.ok() && MulticastAllowed()) {
    absl::StatusOr<MulticastHandle> mc = backend_.MulticastCreate(group_.local_devices, stride);
    if (mc.ok()) {
      a.multicast = true;
      a.multicast_handle = *mc;
    } else {
      local = mc.status();
    }
    for (int d : group_.local_devices) {
      if (local.ok()) local = backend_.MulticastAddDevice(a.multicast_handle, d);
    }
    for (int r : group_.local_ranks) {
      if (local.ok()) local = backend_.MulticastBindMemory(a.multicast_handle, 0, handles[r], 0, stride);
    }
  }

  // 5. Pointers for the host and, in managed memory, for kernels.
  if (local.ok()) local = AllocatePeerTable(a);

  // 6. Everyone mapped everything, or everyone undoes it: a member that
  // failed to import or map says so, and no member keeps an allocation that
  // another lacks.
  if (multi_process) {
    // Each member's size and stride ride along: every member checks that the
    // group built one shape (the one it mapped), whatever any member claims.
    absl::StatusOr<std::vector<Contribution>> commit =
        Round(Op::kCommit, local, {ShapeBytes(bytes, stride), {}});
    if (!commit.ok()) return fail(commit.status());
    if (absl::Status same = CheckSameShape(*commit, bytes, stride); !same.ok()) return fail(same);
  } else if (!local.ok()) {
    return fail(local);
  }

  // 7. The mappings keep the memory alive: handles and FDs can go now (a
  // release that fails is retried when the allocation is destroyed).
  for (int r = 0; r < world; ++r) {
    if (have[r] && !backend_.VmmRelease(handles[r]).ok()) e->unreleased.push_back(handles[r]);
    have[r] = false;
  }
  for (int fd : fds_to_close) close(fd);
  fds_to_close.clear();
  a.bytes = bytes;
  a.stride = stride;
  for (int r = 0; r < world; ++r) {
    AddPeer(a, r, unreachable[r] ? nullptr : static_cast<char*>(a.base) + r * stride);
  }
  if (!unreachable_why.empty()) {
    a.unreachable = absl::StrCat(
        "no peer pointer (peers[r] is null) for: ", absl::StrJoin(unreachable_why, "; "),
        ". Only members of this host (POSIX FDs) and of this NVLink domain (fabric handles) are "
        "mapped; the NVSHMEM provider (SymmetricOptions::provider) reaches the others");
  }
  return e;
}

bool SymmetricHeap::DestroyVmm(Entry& e) {
  SymmetricAllocation& a = e.a;
  if (a.base != nullptr) {
    for (int r = 0; r < group_.world_size; ++r) {
      (void)backend_.VmmUnmap(static_cast<char*>(a.base) + r * a.stride, a.stride);
    }
    if (backend_.VmmFreeAddress(a.base, group_.world_size * a.stride).ok()) a.base = nullptr;
  }
  if (a.device_peers != nullptr && backend_.FreeManaged(a.device_peers).ok()) {
    a.device_peers = nullptr;
  }
  if (a.multicast && backend_.MulticastRelease(a.multicast_handle).ok()) a.multicast = false;
  std::vector<PhysicalHandle> still;
  for (PhysicalHandle h : e.unreleased) {
    if (!backend_.VmmRelease(h).ok()) still.push_back(h);
  }
  e.unreleased = std::move(still);
  return a.base == nullptr && a.device_peers == nullptr && !a.multicast && e.unreleased.empty();
}

}  // namespace cma
