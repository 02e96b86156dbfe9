// The symmetric heap's NVSHMEM provider (symmetric_heap.h, "Providers"):
// NVSHMEM initialised through the heap's own exchange, allocations from
// NVSHMEM's symmetric heap, freed together by EmptyCache. NVSHMEM's
// initialisation, allocation and free are collectives that wait inside
// NVSHMEM for every PE: each is entered only after a round in which every
// member said it will enter it, so that a member that failed locally never
// leaves the others waiting there.
#include <algorithm>
#include <map>
#include <iterator>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/symmetric/pair_handles.h"
#include "allocator/symmetric/symmetric_heap.h"
#include "backends/mutex_lock.h"

namespace cma {

using symmetric_internal::StepClock;

namespace {

// The NVSHMEM provider's stride unit: NVSHMEM's heap is fixed in size
// (NVSHMEM_SYMMETRIC_SIZE, 1 GiB by default), so strides round to 64 KiB
// rather than to a 2 MiB VMM granule.
constexpr std::size_t kShmemGranularity = std::size_t{64} << 10;

}  // namespace

absl::StatusOr<std::unique_ptr<SymmetricHeap>> SymmetricHeap::CreateShmem(
    Backend& backend, SymmetricGroup group, std::unique_ptr<Exchange> exchange,
    SymmetricOptions options) {
  // (Create checked the group and the options that need no backend.)
  // This process's own verdict on the group's shape and the options; it
  // joins the first round, so that a process that refuses fails every
  // process at once rather than leave them to their timeout.
  absl::Status local;
  const int rank = group.local_ranks[0];
  if (group.local_ranks.size() != 1 || group.world_size != exchange->process_count() ||
      rank != exchange->process_index()) {
    local = absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: the NVSHMEM provider serves one member (PE) per process and one GPU per "
        "PE, member r in process r; this process (%d of %d) was given %d members (first: rank %d) "
        "of a group of %d",
        exchange->process_index(), exchange->process_count(), group.local_ranks.size(), rank,
        group.world_size));
  } else if (options.multicast || options.handle_type != HandleType::kPosixFd ||
             options.fabric_fallback) {
    local = absl::InvalidArgumentError(
        "symmetric heap: multicast and fabric handles are options of the VMM provider; the NVSHMEM "
        "provider takes neither");
  } else if (absl::Status d = backend.GetDeviceFacts(group.local_devices[0]).status(); !d.ok()) {
    local = d;
  }
  auto heap = std::unique_ptr<SymmetricHeap>(new SymmetricHeap(
      backend, std::move(group), std::move(exchange), options, kShmemGranularity,
      HandleType::kPosixFd, ""));
  absl::Status started;
  {
    MutexLock l(&heap->mu_);
    started = heap->AgreeOnCreate(local);
    if (started.ok()) started = heap->StartShmem(absl::OkStatus());
  }
  if (!started.ok()) return started;
  return heap;
}

absl::Status SymmetricHeap::StartShmem(const absl::Status& checks) {
  absl::Status local = checks;
  Backend::ShmemState state;
  if (local.ok()) {
    absl::StatusOr<Backend::ShmemState> s = backend_.ShmemQueryState();
    if (s.ok()) {
      state = *s;
    } else {
      local = s.status();
    }
  }
  // 1. Every process's NVSHMEM state: all uninitialised (initialise it
  // together), or all initialised as this group's shape (share it).
  Contribution mine;
  symmetric_internal::Put(mine.bytes, static_cast<std::uint8_t>(state.initialized));
  symmetric_internal::Put(mine.bytes, static_cast<std::int32_t>(state.pe));
  symmetric_internal::Put(mine.bytes, static_cast<std::int32_t>(state.n_pes));
  absl::StatusOr<std::vector<Contribution>> all = Round(Op::kShmemState, local, std::move(mine));
  if (!all.ok()) return all.status();
  int initialized = 0;
  for (std::size_t p = 0; p < all->size(); ++p) {
    std::size_t pos = 0;
    std::uint8_t init = 0;
    std::int32_t pe = 0, n = 0;
    if (!symmetric_internal::Get((*all)[p].bytes, pos, init) || !symmetric_internal::Get((*all)[p].bytes, pos, pe) ||
        !symmetric_internal::Get((*all)[p].bytes, pos, n)) {
      return absl::DataLossError(absl::StrCat("symmetric heap: malformed NVSHMEM state from process ", p));
    }
    if (init && (pe != static_cast<int>(p) || n != group_.world_size)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "symmetric heap: NVSHMEM is initialised already in process %d as PE %d of %d, not as PE "
          "%d of this group of %d; NVSHMEM is initialised once per process (cma never finalises "
          "it), so every heap must have the group it was first initialised with",
          p, pe, n, p, group_.world_size));
    }
    initialized += init;
  }
  if (initialized == static_cast<int>(all->size())) return absl::OkStatus();
  if (initialized != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "symmetric heap: NVSHMEM is initialised in %d of the %d processes (an earlier "
        "initialisation failed on some); it cannot be initialised again in those: start new "
        "processes",
        initialized, all->size()));
  }
  // 2. Process 0's unique id, to every process over this exchange.
  Contribution id;
  absl::Status made;
  if (exchange_->process_index() == 0) {
    absl::StatusOr<std::string> uid = backend_.ShmemUniqueId();
    if (uid.ok()) {
      id.bytes = std::move(*uid);
    } else {
      made = uid.status();
    }
  }
  absl::StatusOr<std::vector<Contribution>> ids = Round(Op::kShmemId, made, std::move(id));
  if (!ids.ok()) return ids.status();
  // 3. Every process enters NVSHMEM's initialisation, now that all will.
  const absl::Status init = backend_.ShmemInit((*ids)[0].bytes, group_.local_ranks[0],
                                               group_.world_size, group_.local_devices[0]);
  absl::StatusOr<std::vector<Contribution>> done = Round(Op::kShmemInit, init, {});
  return done.status();
}

absl::StatusOr<std::unique_ptr<SymmetricHeap::Entry>> SymmetricHeap::BuildShmem(std::size_t bytes,
                                                                                 std::size_t stride) {
  const int world = group_.world_size;
  const int me = group_.local_ranks[0];
  StepClock clock(miss_seconds_);
  auto e = std::make_unique<Entry>();
  SymmetricAllocation& a = e->a;
  a.id = next_id_++;  // taken first, so that ids stay in step when a build fails
  auto undo = [&](absl::Status s) -> absl::Status {
    if (a.device_peers != nullptr) (void)backend_.FreeManaged(a.device_peers);
    return s;
  };

  // 1. Everything local that can fail, before NVSHMEM's collective.
  absl::Status local = HoldNonDumpable();
  if (local.ok()) local = AllocatePeerTable(a);
  // 2. Every member ready, or none enters nvshmem_malloc.
  // With each member's size and stride: NVSHMEM's allocation is entered only
  // once every member checked that all ask for the one it will map.
  absl::StatusOr<std::vector<Contribution>> ready =
      Round(Op::kShmemReady, local, {ShapeBytes(bytes, stride), {}});
  if (!ready.ok()) return undo(ready.status());
  if (absl::Status same = CheckSameShape(*ready, bytes, stride); !same.ok()) return undo(same);

  // 3. NVSHMEM's allocation, collective; then every member's outcome. A
  // failure on every member leaves nothing behind; a mixed one strands the
  // memory of those that got it (NVSHMEM frees only collectively).
  absl::StatusOr<void*> p = clock.Time("ShmemMalloc", [&] { return backend_.ShmemMalloc(stride); });
  Contribution outcome;
  symmetric_internal::Put(outcome.bytes, static_cast<std::uint8_t>(p.ok()));
  if (!p.ok()) outcome.bytes += std::string(p.status().message()).substr(0, 512);
  absl::StatusOr<std::vector<Contribution>> outcomes = Round(Op::kCommit, absl::OkStatus(), outcome);
  if (!outcomes.ok()) {
    // The exchange broke (Round says so from now on): whatever NVSHMEM gave
    // this member stays in NVSHMEM's heap.
    return undo(outcomes.status());
  }
  std::vector<int> failed;
  std::string first_reason;
  for (std::size_t q = 0; q < outcomes->size(); ++q) {
    std::size_t pos = 0;
    std::uint8_t ok = 0;
    if (!symmetric_internal::Get((*outcomes)[q].bytes, pos, ok)) ok = 0;
    if (!ok) {
      failed.push_back(static_cast<int>(q));
      if (first_reason.empty()) first_reason = (*outcomes)[q].bytes.substr(pos);
    }
  }
  if (static_cast<int>(failed.size()) == world) {
    return undo(p.ok() ? absl::InternalError("symmetric heap: inconsistent NVSHMEM outcomes")
                       : p.status());
  }
  if (!failed.empty()) {
    broken_ = absl::InternalError(absl::StrFormat(
        "symmetric heap: nvshmem_malloc(%d) failed on members %s (%s) and not on the others, "
        "whose memory stays in NVSHMEM's heap (it is freed only by every PE together)",
        stride, absl::StrJoin(failed, ", "), first_reason));
    return undo(broken_);
  }

  // 4. Every member's buffer as NVSHMEM maps it here (nvshmem_ptr), or null.
  e->shmem = *p;
  e->own_bytes = stride;
  a.bytes = bytes;
  a.stride = stride;
  std::vector<std::string> unreachable;
  for (int r = 0; r < world; ++r) {
    void* peer = *p;
    if (r != me) {
      absl::StatusOr<void*> q = backend_.ShmemPeerPointer(*p, r);
      peer = q.ok() ? *q : nullptr;
      if (peer == nullptr) {
        unreachable.push_back(q.ok() ? absl::StrCat(r) : absl::StrCat(r, " (", q.status().message(), ")"));
      }
    }
    AddPeer(a, r, peer);
  }
  if (!unreachable.empty()) {
    a.unreachable = absl::StrCat(
        "no peer pointer (peers[r] is null) for members ", absl::StrJoin(unreachable, ", "),
        ": NVSHMEM cannot reach them by load/store from here (nvshmem_ptr is null); Put and Get "
        "reach them through NVSHMEM's put/get");
  }
  return e;
}

absl::Status SymmetricHeap::EmptyShmemCache() {
  // Members free together only what every member has cached (their caches
  // differ when their frees did), in collective-id order, as NVSHMEM's
  // free requires.
  Contribution mine;
  symmetric_internal::Put(mine.bytes, static_cast<std::uint64_t>(cache_.size()));
  std::set<std::uint64_t> ids;
  for (const auto& [key, e] : cache_) {
    symmetric_internal::Put(mine.bytes, key.second);
    ids.insert(key.second);
  }
  absl::StatusOr<std::vector<Contribution>> all = Round(Op::kEmptyCache, absl::OkStatus(), mine);
  if (!all.ok()) return all.status();
  std::set<std::uint64_t> common = ids;
  for (std::size_t p = 0; p < all->size(); ++p) {
    std::size_t pos = 0;
    std::uint64_t n = 0;
    std::set<std::uint64_t> theirs;
    if (!symmetric_internal::Get((*all)[p].bytes, pos, n) || n > (*all)[p].bytes.size() / sizeof(std::uint64_t)) {
      return absl::DataLossError(absl::StrCat("symmetric heap: malformed cache list from process ", p));
    }
    for (std::uint64_t k = 0; k < n; ++k) {
      std::uint64_t id = 0;
      if (!symmetric_internal::Get((*all)[p].bytes, pos, id)) {
        return absl::DataLossError(absl::StrCat("symmetric heap: malformed cache list from process ", p));
      }
      theirs.insert(id);
    }
    std::set<std::uint64_t> both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(),
                          std::inserter(both, both.end()));
    common = std::move(both);
  }
  std::map<std::uint64_t, std::pair<std::size_t, std::uint64_t>> doomed;  // by id
  for (const auto& [key, e] : cache_) {
    if (common.count(key.second) != 0) doomed[key.second] = key;
  }
  for (const auto& [id, key] : doomed) {
    auto it = cache_.find(key);
    Entry& e = *it->second;
    absl::Status freed = backend_.ShmemFree(e.shmem);
    if (!freed.ok()) {
      // NVSHMEM's heaps may now differ between members: nothing collective
      // can go on safely.
      broken_ = absl::InternalError(absl::StrCat(
          "symmetric heap: nvshmem_free of allocation ", id, " failed: ", freed.message()));
      return broken_;
    }
    e.shmem = nullptr;
    PublishEmptied(e);
    std::unique_ptr<Entry> gone = std::move(it->second);
    cache_.erase(it);
    if (!Destroy(*gone)) leftovers_.push_back(std::move(gone));
  }
  return absl::OkStatus();
}

}  // namespace cma
