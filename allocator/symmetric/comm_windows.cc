// SymmetricHeap's communicator windows (symmetric_heap.h: RegisterWindow,
// ReleaseWindows): the agreement around the library's own collective.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/pair_handles.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/mutex_lock.h"

namespace cma {

absl::StatusOr<CommWindow> SymmetricHeap::RegisterWindow(const SymmetricHandle& handle,
                                                         CommHandle comm) {
  MutexLock l(&mu_);
  // Every member joins the first round with its verdict, even a failing
  // one: the others would otherwise wait in the library's collective.
  absl::Status local;
  Entry* e = nullptr;
  const CommWindow* cached = nullptr;
  if (options_.provider != SymmetricProvider::kVmm) {
    local = absl::UnimplementedError(
        "symmetric heap: communicator windows need the VMM provider (NCCL registers cuMem "
        "allocations of its own; NVSHMEM's heap is NVSHMEM's)");
  } else if (group_.local_ranks.size() != 1) {
    local = absl::UnimplementedError(absl::StrFormat(
        "symmetric heap: communicator windows need one member per process (this one serves "
        "%d)", group_.local_ranks.size()));
  } else if (comm == 0) {
    local = absl::InvalidArgumentError("symmetric heap: RegisterWindow with a null communicator");
  } else {
    absl::StatusOr<Entry*> live = LiveEntry(handle, "RegisterWindow");
    if (!live.ok()) {
      local = live.status();
    } else {
      e = *live;
      for (const auto& [c, w] : e->windows) {
        if (c == comm) cached = &w;
      }
    }
  }
  if (local.ok()) {
    // The communicator must be this member's (NCCL would register the
    // buffer under another rank's place, or on another device), and still
    // answer, cached window or not.
    absl::StatusOr<CommFacts> f = backend_.GetCommFacts(comm);
    if (!f.ok()) {
      local = f.status();
    } else if (f->size != group_.world_size || f->rank != group_.local_ranks[0] ||
               f->device != group_.local_devices[0]) {
      local = absl::InvalidArgumentError(absl::StrFormat(
          "symmetric heap: the communicator is rank %d of %d on device %d, but this member is "
          "rank %d of %d on device %d",
          f->rank, f->size, f->device, group_.local_ranks[0], group_.world_size,
          group_.local_devices[0]));
    }
  }
  Contribution mine;
  symmetric_internal::Put(mine.bytes, e != nullptr ? e->a.id : std::uint64_t{0});
  symmetric_internal::Put(mine.bytes, static_cast<std::uint8_t>(cached != nullptr));
  absl::StatusOr<std::vector<Contribution>> all = Round(Op::kWindow, local, mine);
  if (!all.ok()) return all.status();
  absl::Status disagree;
  for (std::size_t p = 0; p < all->size(); ++p) {
    std::size_t pos = 0;
    std::uint64_t id = 0;
    std::uint8_t has = 0;
    if (!symmetric_internal::Get((*all)[p].bytes, pos, id) ||
        !symmetric_internal::Get((*all)[p].bytes, pos, has)) {
      return absl::DataLossError(
          absl::StrCat("symmetric heap: malformed RegisterWindow from process ", p));
    }
    if (id != e->a.id) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "symmetric heap: members registered different allocations (process %d: %d, this "
          "process: %d)",
          p, id, e->a.id));
    }
    // Registrations are made and released together; members whose
    // communicators differ (each process names its own) can still drift.
    if (static_cast<bool>(has) != (cached != nullptr) && disagree.ok()) {
      disagree = absl::FailedPreconditionError(absl::StrFormat(
          "symmetric heap: process %d %s a window of allocation %d on this communicator and "
          "this process %s; the stray windows are released: register again",
          p, has ? "holds" : "lacks", id, cached != nullptr ? "holds one" : "does not"));
    }
  }
  if (!disagree.ok()) {
    if (cached != nullptr) DropWindows(*e, comm);  // every member back to none
    return disagree;
  }
  if (cached != nullptr) return *cached;

  const int me = group_.local_ranks[0];
  absl::StatusOr<CommWindow> w = backend_.RegisterCommWindow(comm, e->a.peers[me], e->a.stride);
  absl::Status made = w.status();
  if (w.ok() && *w == 0) {
    made = absl::UnimplementedError(
        "symmetric heap: the library registered no window: symmetric windows are not supported "
        "on this communicator (NCCL needs CUDA VMM and peers reachable by load/store, and "
        "NCCL 2.28 makes none on a non-blocking communicator)");
  }
  absl::StatusOr<std::vector<Contribution>> commit = Round(Op::kWindowCommit, made, {});
  if (!commit.ok()) {
    if (made.ok()) (void)backend_.DeregisterCommWindow(comm, *w);
    return commit.status();
  }
  e->windows.emplace_back(comm, *w);
  MutexLock s(&stats_mu_);
  ++stats_.windows;
  return *w;
}

absl::StatusOr<int> SymmetricHeap::ReleaseWindows(CommHandle comm) {
  MutexLock l(&mu_);
  const absl::Status local =
      comm == 0 ? absl::InvalidArgumentError("symmetric heap: ReleaseWindows of a null communicator")
                : absl::OkStatus();
  // Each member names the allocations whose windows it would release: a
  // member that would drop others' (its communicator is not the others'
  // counterpart, say) fails them all, and nothing is released.
  std::vector<Entry*> holders;
  for (auto& [a, e] : live_) {
    for (const auto& [c, w] : e->windows) {
      if (c == comm) holders.push_back(e.get());
    }
  }
  for (auto& [key, e] : cache_) {
    for (const auto& [c, w] : e->windows) {
      if (c == comm) holders.push_back(e.get());
    }
  }
  std::vector<std::uint64_t> ids;
  for (const Entry* e : holders) ids.push_back(e->a.id);
  std::sort(ids.begin(), ids.end());
  Contribution mine;
  symmetric_internal::Put(mine.bytes, static_cast<std::uint64_t>(ids.size()));
  for (std::uint64_t id : ids) symmetric_internal::Put(mine.bytes, id);
  absl::StatusOr<std::vector<Contribution>> all = Round(Op::kReleaseWindows, local, mine);
  if (!all.ok()) return all.status();
  for (std::size_t p = 0; p < all->size(); ++p) {
    if ((*all)[p].bytes != mine.bytes) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "symmetric heap: ReleaseWindows: process %d holds windows on its communicator for "
          "other allocations than this process on its own (%d here); nothing is released: pass "
          "every member's counterpart of one communicator",
          p, ids.size()));
    }
  }
  int released = 0;
  for (Entry* e : holders) released += DropWindows(*e, comm);
  return released;
}

int SymmetricHeap::DropWindows(Entry& e, CommHandle comm) {
  int dropped = 0;
  std::vector<std::pair<CommHandle, CommWindow>> kept;
  for (const auto& [c, w] : e.windows) {
    if (comm != 0 && c != comm) {
      kept.emplace_back(c, w);
      continue;
    }
    (void)backend_.DeregisterCommWindow(c, w);
    ++dropped;
  }
  e.windows = std::move(kept);
  if (dropped > 0) {
    MutexLock s(&stats_mu_);
    stats_.windows -= dropped;
  }
  return dropped;
}

}  // namespace cma
