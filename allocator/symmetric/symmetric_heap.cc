#include "backends/mutex_lock.h"
#include "allocator/symmetric/symmetric_heap.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/handle_choice.h"
#include "allocator/symmetric/pair_handles.h"

namespace cma {
namespace {


bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

}  // namespace

const char* SymmetricProviderName(SymmetricProvider p) {
  switch (p) {
    case SymmetricProvider::kVmm: return "vmm";
    case SymmetricProvider::kNvshmem: return "nvshmem";
  }
  return "unknown";
}

namespace {

// What a VMM heap learns about this process's devices at Create.
struct VmmSetup {
  std::size_t granularity = 0;
  HandleChoice handles;
  std::string domain;  // across hosts with fabric handles: this process's NVLink domain
};

absl::StatusOr<VmmSetup> CheckVmm(Backend& backend, const SymmetricGroup& group,
                                  const SymmetricOptions& options, const Exchange& exchange) {
  VmmSetup out;
  for (std::size_t i = 0; i < group.local_ranks.size(); ++i) {
    absl::StatusOr<DeviceFacts> f = backend.GetDeviceFacts(group.local_devices[i]);
    if (!f.ok()) return f.status();
    if (!f->vmm_supported) {
      return absl::UnimplementedError(absl::StrFormat(
          "symmetric heap: device %d does not support virtual memory management on the %s backend",
          group.local_devices[i], backend.name()));
    }
    if (options.handle_type == HandleType::kPosixFd && !f->posix_fd_handles) {
      return absl::UnimplementedError("symmetric heap: the device cannot export POSIX FD handles");
    }
    out.granularity = std::max(out.granularity, f->vmm_granularity);
  }
  absl::StatusOr<HandleChoice> handles = ChooseHandleType(
      backend, group.local_devices, options.handle_type, options.fabric_fallback, out.granularity);
  if (!handles.ok()) return handles.status();
  out.handles = std::move(*handles);
  // Across hosts, fabric handles go to the members of this NVLink domain:
  // this process's is its first device's (empty when unknown, or when its
  // devices do not all report the same one).
  if (exchange.host_count() > 1 && out.handles.type == HandleType::kFabric) {
    for (std::size_t i = 0; i < group.local_devices.size(); ++i) {
      absl::StatusOr<DeviceFacts> f = backend.GetDeviceFacts(group.local_devices[i]);
      if (!f.ok()) return f.status();
      if (i == 0) out.domain = f->fabric_domain;
      if (f->fabric_domain != out.domain || out.domain.size() > 64) out.domain.clear();
    }
  }
  return out;
}

}  // namespace

absl::Status SymmetricHeap::CheckGroup(const SymmetricGroup& group,
                                       const SymmetricOptions& options) {
  if (group.world_size < 1 || group.local_ranks.empty() ||
      group.local_ranks.size() != group.local_devices.size()) {
    return absl::InvalidArgumentError(
        "symmetric heap: a group needs world_size >= 1 and one device per local rank");
  }
  if (options.provider != SymmetricProvider::kVmm && options.provider != SymmetricProvider::kNvshmem) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: unknown provider %d (kVmm or kNvshmem)", static_cast<int>(options.provider)));
  }
  std::vector<bool> seen(group.world_size, false);
  for (const int r : group.local_ranks) {
    if (r < 0 || r >= group.world_size || seen[r]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "symmetric heap: local rank %d is out of range or repeated (world size %d)", r,
          group.world_size));
    }
    seen[r] = true;
  }
  if (options.signal_bytes == 0 || options.signal_bytes % 16 != 0) {
    return absl::InvalidArgumentError("symmetric heap: signal_bytes must be a positive multiple of 16");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SymmetricHeap>> SymmetricHeap::Create(
    Backend& backend, SymmetricGroup group, std::unique_ptr<Exchange> exchange,
    SymmetricOptions options) {
  if (exchange == nullptr) return absl::InvalidArgumentError("symmetric heap: no exchange");
  // Every check below is this process's own; across processes its verdict
  // joins the create round (AgreeOnCreate), so that a process with a bad
  // rank, device or option fails every process now, naming it, rather than
  // leaving the others a heap whose first collective waits out its timeout.
  absl::Status local = CheckGroup(group, options);
  if (local.ok() && options.provider == SymmetricProvider::kNvshmem) {
    return CreateShmem(backend, std::move(group), std::move(exchange), options);
  }
  VmmSetup vmm;
  if (local.ok()) {
    absl::StatusOr<VmmSetup> checked = CheckVmm(backend, group, options, *exchange);
    if (checked.ok()) {
      vmm = std::move(*checked);
    } else {
      local = checked.status();
    }
  }
  if (!local.ok() && exchange->process_count() == 1) return local;
  if (!local.ok()) vmm.handles.type = options.handle_type;
  auto heap = std::unique_ptr<SymmetricHeap>(new SymmetricHeap(
      backend, std::move(group), std::move(exchange), options, vmm.granularity, vmm.handles.type,
      std::move(vmm.handles.fallback_reason)));
  heap->fabric_domain_ = std::move(vmm.domain);
  {
    MutexLock l(&heap->mu_);
    if (absl::Status agreed = heap->AgreeOnCreate(local); !agreed.ok()) return agreed;
  }
  return heap;
}

SymmetricHeap::~SymmetricHeap() {
  MutexLock l(&mu_);
  for (auto& [a, e] : live_) Destroy(*e);
  for (auto& [key, e] : cache_) Destroy(*e);
  for (auto& e : leftovers_) Destroy(*e);
  // What Destroy could not release stays mapped, but the heap's hold on
  // the process's dumpable setting goes with the heap.
  live_.clear();
  cache_.clear();
  leftovers_.clear();
  ReleaseNonDumpableIfEmpty();
}

bool SymmetricHeap::MulticastAllowed() const {
  if (!options_.multicast || exchange_->process_count() != 1) return false;
  if (EnvIs("CMA_DISABLE_MULTICAST", "1") || EnvIs("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1") ||
      EnvIs("NCCL_NVLS_ENABLE", "0")) {
    return false;
  }
  for (int d : group_.local_devices) {
    absl::StatusOr<DeviceFacts> f = backend_.GetDeviceFacts(d);
    if (!f.ok() || !f->multicast_supported) return false;
  }
  return true;
}

std::uint64_t SymmetricHeap::Candidate(std::size_t stride) const {
  auto it = cache_.lower_bound({stride, 0});
  return it != cache_.end() && it->first.first == stride ? it->first.second : 0;
}

bool SymmetricHeap::AllName(std::uint64_t mine, const std::vector<std::uint64_t>& theirs) {
  return mine != 0 &&
         std::all_of(theirs.begin(), theirs.end(), [&](std::uint64_t id) { return id == mine; });
}

SymmetricHandle SymmetricHeap::HandOut(std::unique_ptr<Entry> e) {
  e->generation = next_generation_++;
  const SymmetricHandle h{&e->a, e->generation, id_};
  live_[h.allocation] = std::move(e);
  return h;
}

SymmetricHandle SymmetricHeap::FromCache(std::size_t bytes, std::size_t stride,
                                         std::uint64_t id) {
  auto it = cache_.find({stride, id});
  if (it == cache_.end()) return {};
  std::unique_ptr<Entry> e = std::move(it->second);
  cache_.erase(it);
  e->a.bytes = bytes;  // the signal areas stay where they are: at the stride's end
  PublishHit(*e);
  return HandOut(std::move(e));
}

namespace {

// The rounds' format, in their magic: "CMAR" was format 1; "CMR2" (format
// 2) adds the create round, a size and stride in the build's last round,
// and a heap's options in the create round.
constexpr std::uint32_t kRoundMagicV1 = 0x434d4152;  // "CMAR"
constexpr std::uint32_t kRoundMagic = 0x434d5232;    // "CMR2"

const char* OpName(std::uint8_t op) {
  switch (op) {
    case 1: return "Allocate (sizes)";
    case 2: return "Allocate (make_symmetric's cache candidates)";
    case 3: return "Allocate (handles)";
    case 4: return "Allocate (commit)";
    case 5: return "EmptyCache";
    case 6: return "Create (NVSHMEM's state)";
    case 7: return "Create (NVSHMEM's unique id)";
    case 8: return "Create (NVSHMEM initialised)";
    case 9: return "Allocate (ready for nvshmem_malloc)";
    case 10: return "RegisterWindow";
    case 11: return "RegisterWindow (commit)";
    case 12: return "ReleaseWindows";
    case 13: return "Create";
    default: return "an unknown collective";
  }
}

}  // namespace

absl::StatusOr<std::vector<Contribution>> SymmetricHeap::Round(Op op, const absl::Status& local,
                                                               Contribution mine) {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "symmetric heap: an earlier collective failed, so the members' state is unknown (",
        broken_.message(), "); create a new heap"));
  }
  // Every round carries its op and sequence number, and whether this
  // process got this far: members out of step, or one that failed, are
  // named rather than misread.
  const std::uint64_t seq = ++rounds_;
  std::string tagged;
  symmetric_internal::Put(tagged, kRoundMagic);
  symmetric_internal::Put(tagged, static_cast<std::uint8_t>(op));
  symmetric_internal::Put(tagged, static_cast<std::uint8_t>(local.ok()));
  symmetric_internal::Put(tagged, seq);
  if (local.ok()) {
    tagged += mine.bytes;
  } else {
    tagged += std::string(local.message()).substr(0, 1024);
    mine.fds.clear();  // nothing to hand out: the caller closes its own
  }
  mine.bytes = std::move(tagged);
  {
    MutexLock s(&stats_mu_);
    ++stats_.exchanges;
  }
  absl::StatusOr<std::vector<Contribution>> all = exchange_->AllGather(mine);
  if (!all.ok()) {
    broken_ = all.status();
    return all.status();
  }
  auto close_all = [&] {
    for (Contribution& c : *all) {
      for (int fd : c.fds) close(fd);
      c.fds.clear();
    }
  };
  absl::Status failed;
  for (std::size_t p = 0; p < all->size(); ++p) {
    Contribution& c = (*all)[p];
    std::size_t pos = 0;
    std::uint32_t magic = 0;
    std::uint8_t their_op = 0, ok = 0;
    std::uint64_t their_seq = 0;
    if (!symmetric_internal::Get(c.bytes, pos, magic) || !symmetric_internal::Get(c.bytes, pos, their_op) || !symmetric_internal::Get(c.bytes, pos, ok) ||
        !symmetric_internal::Get(c.bytes, pos, their_seq) || magic != kRoundMagic || their_op != static_cast<std::uint8_t>(op) ||
        their_seq != seq) {
      close_all();
      broken_ = absl::FailedPreconditionError(absl::StrFormat(
          "symmetric heap: the collective calls are out of step: process %d is in %s #%d "
          "while this process is in %s #%d",
          p,
          magic == kRoundMagic     ? OpName(their_op)
          : magic == kRoundMagicV1 ? "a round of an older cma (format 1; this is format 2)"
                                   : "no collective of this heap",
          their_seq,
          OpName(static_cast<std::uint8_t>(op)), seq));
      return broken_;
    }
    c.bytes.erase(0, pos);
    if (!ok && failed.ok()) {
      failed = absl::AbortedError(
          absl::StrCat("symmetric heap: process ", p, " failed this collective: ", c.bytes));
    }
  }
  if (!local.ok()) failed = local;  // a member that failed reports its own reason
  // Only the handles round carries descriptors; anything else a peer sent
  // is closed here, on every path.
  if (!failed.ok() || op != Op::kHandles) close_all();
  if (!failed.ok()) return failed;
  return all;
}

absl::StatusOr<SymmetricHandle> SymmetricHeap::Allocate(std::size_t bytes, bool make_symmetric) {
  MutexLock l(&mu_);
  if (exchange_->process_count() == 1 && bytes != 0 && group_granularity_ != 0) {
    // One process: its cache is the group's, so a hit needs no agreement.
    // (A size whose stride overflows is refused by AgreeOnSize.)
    if (absl::StatusOr<std::size_t> stride = StrideFor(bytes, group_granularity_); stride.ok()) {
      if (const std::uint64_t id = Candidate(*stride); id != 0) return FromCache(bytes, *stride, id);
    }
  }
  absl::StatusOr<Agreed> agreed = AgreeOnSize(bytes, make_symmetric);
  if (!agreed.ok()) return agreed.status();
  const std::size_t stride = agreed->stride;
  // A hit only when every member names the same cached allocation: with
  // caches that drifted apart (frees that differed), or a member with none,
  // the group builds a new one together instead of each taking its own.
  const std::uint64_t mine = Candidate(stride);
  if (AllName(mine, agreed->candidates)) return FromCache(agreed->bytes, stride, mine);
  absl::StatusOr<std::unique_ptr<Entry>> e = Build(agreed->bytes, stride);
  if (!e.ok()) {
    ReleaseNonDumpableIfEmpty();
    MutexLock s(&stats_mu_);
    stats_.last_miss_seconds = miss_seconds_;  // where the failed miss spent its time
    return e.status();
  }
  PublishMiss(**e);
  return HandOut(std::move(*e));
}

absl::StatusOr<std::unique_ptr<SymmetricHeap::Entry>> SymmetricHeap::Build(std::size_t bytes,
                                                                            std::size_t stride) {
  return options_.provider == SymmetricProvider::kNvshmem ? BuildShmem(bytes, stride)
                                                          : BuildVmm(bytes, stride);
}

absl::Status SymmetricHeap::Free(const SymmetricHandle& handle) {
  MutexLock l(&mu_);
  // Looked up by address alone (a stale or foreign pointer is never read),
  // then by generation: a cache hit hands the same allocation out again,
  // and a new one may be built where an emptied one was.
  absl::StatusOr<Entry*> live = LiveEntry(handle, "free");
  if (!live.ok()) return live.status();
  auto it = live_.find(handle.allocation);
  std::unique_ptr<Entry> e = std::move(it->second);
  live_.erase(it);
  PublishFree(*e);
  const std::pair<std::size_t, std::uint64_t> key{e->a.stride, e->a.id};
  cache_.emplace(key, std::move(e));
  return absl::OkStatus();
}

std::uint64_t SymmetricHeap::NextHeapId() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

absl::StatusOr<SymmetricHeap::Entry*> SymmetricHeap::LiveEntry(const SymmetricHandle& handle,
                                                                const char* who) {
  // Another heap's handle is refused before its address is looked up: it
  // may name an allocation of this heap built where that heap's was freed.
  if (handle.heap != 0 && handle.heap != id_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: %s of a handle that another heap handed out (heap %d; this is heap %d): "
        "refused, nothing changed",
        who, handle.heap, id_));
  }
  auto it = live_.find(handle.allocation);
  if (it != live_.end() && handle.heap == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "symmetric heap: ", who,
        " of a handle without a heap identity (not a copy of one Allocate returned): refused"));
  }
  if (it == live_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "symmetric heap: ", who,
        " of an allocation that is not live here (double free, a null handle, or a pointer this "
        "heap did not hand out)"));
  }
  if (it->second->generation != handle.generation) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: %s of a stale handle (generation %d; allocation %d is live again as "
        "generation %d): it was freed already and handed out again",
        who, handle.generation, it->second->a.id, it->second->generation));
  }
  return it->second.get();
}

absl::Status SymmetricHeap::Put(const SymmetricHandle& handle, int rank, std::size_t offset,
                                const void* src, std::size_t bytes, Stream stream) {
  return Transfer(true, handle, rank, offset, const_cast<void*>(src), bytes, stream);
}

absl::Status SymmetricHeap::Get(const SymmetricHandle& handle, int rank, std::size_t offset,
                                void* dst, std::size_t bytes, Stream stream) {
  return Transfer(false, handle, rank, offset, dst, bytes, stream);
}

absl::Status SymmetricHeap::Transfer(bool put, const SymmetricHandle& handle, int rank,
                                     std::size_t offset, void* local, std::size_t bytes,
                                     Stream stream) {
  const char* who = put ? "put" : "get";
  MutexLock l(&mu_);
  absl::StatusOr<Entry*> e = LiveEntry(handle, who);
  if (!e.ok()) return e.status();
  const SymmetricAllocation& a = (*e)->a;
  if (rank < 0 || rank >= group_.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: %s to member %d of a group of %d", who, rank, group_.world_size));
  }
  // Bounded by what is mapped, not only by what was asked for: the bytes
  // handed out, and never past a member's stride less its signal area (the
  // local and every remote buffer are that large). Written so that a huge
  // offset or size cannot wrap around.
  const std::size_t usable = a.stride >= options_.signal_bytes ? a.stride - options_.signal_bytes : 0;
  const std::size_t limit = std::min(a.bytes, usable);
  if (offset > limit || bytes > limit - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: %s of bytes [%d, %d + %d) is past the allocation's %d bytes%s", who,
        offset, offset, bytes, a.bytes,
        limit < a.bytes ? absl::StrFormat(" (%d mapped per member)", usable) : ""));
  }
  if (bytes == 0) return absl::OkStatus();
  if (local == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("symmetric heap: ", who, " with a null local pointer"));
  }
  if (a.peers[rank] != nullptr) {
    char* there = static_cast<char*>(a.peers[rank]) + offset;
    return put ? backend_.PeerCopy(there, local, bytes, stream)
               : backend_.PeerCopy(local, there, bytes, stream);
  }
  if ((*e)->shmem == nullptr) {
    return absl::UnavailableError(absl::StrFormat(
        "symmetric heap: member %d has no mapping in this process (%s), and the VMM provider has no "
        "other path to it: the NVSHMEM provider's %s reaches it",
        rank, a.unreachable, who));
  }
  // NVSHMEM names member r's buffer by this PE's address of its own.
  char* symmetric = static_cast<char*>((*e)->shmem) + offset;
  absl::Status s = put ? backend_.ShmemPut(symmetric, local, bytes, rank, stream)
                       : backend_.ShmemGet(local, symmetric, bytes, rank, stream);
  // Delivered (a put) or landed (a get) at this point of the stream.
  if (s.ok()) s = backend_.ShmemQuiet(stream);
  return s;
}

absl::Status SymmetricHeap::EmptyCache() {
  MutexLock l(&mu_);
  // Collective: all processes drop the same entries, keeping caches identical.
  if (options_.provider == SymmetricProvider::kNvshmem) {
    absl::Status s = EmptyShmemCache();
    ReleaseNonDumpableIfEmpty();
    return s;
  }
  absl::StatusOr<std::vector<Contribution>> barrier =
      Round(Op::kEmptyCache, absl::OkStatus(), Contribution{});
  if (!barrier.ok()) return barrier.status();
  for (auto& [key, e] : cache_) {
    PublishEmptied(*e);
    if (!Destroy(*e)) leftovers_.push_back(std::move(e));
  }
  cache_.clear();
  ReleaseNonDumpableIfEmpty();
  return absl::OkStatus();
}

void SymmetricHeap::AddPeer(SymmetricAllocation& a, int r, void* buffer) const {
  a.peers.push_back(buffer);
  a.signals.push_back(buffer != nullptr
                          ? static_cast<char*>(buffer) + a.stride - options_.signal_bytes
                          : nullptr);
  static_cast<void**>(a.device_peers)[r] = buffer;
}

absl::Status SymmetricHeap::AllocatePeerTable(SymmetricAllocation& a) const {
  absl::StatusOr<void*> table =
      backend_.AllocateManaged(group_.local_devices[0], group_.world_size * sizeof(void*));
  if (!table.ok()) return table.status();
  a.device_peers = *table;
  return absl::OkStatus();
}

bool SymmetricHeap::Destroy(Entry& e) {
  DropWindows(e);  // the library lets go of this memory before it is unmapped
  if (options_.provider == SymmetricProvider::kVmm) return DestroyVmm(e);
  // NVSHMEM's memory goes only in EmptyShmemCache (a collective); here,
  // this process's own table.
  SymmetricAllocation& a = e.a;
  if (a.device_peers != nullptr && backend_.FreeManaged(a.device_peers).ok()) {
    a.device_peers = nullptr;
  }
  return a.device_peers == nullptr;
}

}  // namespace cma
