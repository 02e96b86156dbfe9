#include "backends/mutex_lock.h"
#include "allocator/symmetric/symmetric_heap.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/symmetric/handle_choice.h"
#include "allocator/symmetric/pair_handles.h"

namespace cma {
namespace {


std::size_t RoundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

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

absl::StatusOr<std::unique_ptr<SymmetricHeap>> SymmetricHeap::Create(
    Backend& backend, SymmetricGroup group, std::unique_ptr<Exchange> exchange,
    SymmetricOptions options) {
  if (exchange == nullptr) return absl::InvalidArgumentError("symmetric heap: no exchange");
  if (group.world_size < 1 || group.local_ranks.empty() ||
      group.local_ranks.size() != group.local_devices.size()) {
    return absl::InvalidArgumentError(
        "symmetric heap: a group needs world_size >= 1 and one device per local rank");
  }
  if (options.provider != SymmetricProvider::kVmm && options.provider != SymmetricProvider::kNvshmem) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: unknown provider %d (kVmm or kNvshmem)", static_cast<int>(options.provider)));
  }
  if (options.provider == SymmetricProvider::kNvshmem) {
    return CreateShmem(backend, std::move(group), std::move(exchange), options);
  }
  std::size_t granularity = 0;
  std::vector<bool> seen(group.world_size, false);
  for (std::size_t i = 0; i < group.local_ranks.size(); ++i) {
    const int r = group.local_ranks[i];
    if (r < 0 || r >= group.world_size || seen[r]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "symmetric heap: local rank %d is out of range or repeated (world size %d)", r,
          group.world_size));
    }
    seen[r] = true;
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
    granularity = std::max(granularity, f->vmm_granularity);
  }
  if (options.signal_bytes == 0 || options.signal_bytes % 16 != 0) {
    return absl::InvalidArgumentError("symmetric heap: signal_bytes must be a positive multiple of 16");
  }
  absl::StatusOr<HandleChoice> handles = ChooseHandleType(
      backend, group.local_devices, options.handle_type, options.fabric_fallback, granularity);
  if (!handles.ok()) return handles.status();
  // Across hosts, fabric handles go to the members of this NVLink domain:
  // this process's is its first device's (empty when unknown, or when its
  // devices do not all report the same one).
  std::string domain;
  if (exchange->host_count() > 1 && handles->type == HandleType::kFabric) {
    for (std::size_t i = 0; i < group.local_devices.size(); ++i) {
      absl::StatusOr<DeviceFacts> f = backend.GetDeviceFacts(group.local_devices[i]);
      if (!f.ok()) return f.status();
      if (i == 0) domain = f->fabric_domain;
      if (f->fabric_domain != domain || domain.size() > 64) domain.clear();
    }
  }
  auto heap = std::unique_ptr<SymmetricHeap>(new SymmetricHeap(
      backend, std::move(group), std::move(exchange), options, granularity, handles->type,
      std::move(handles->fallback_reason)));
  heap->fabric_domain_ = std::move(domain);
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

std::size_t SymmetricHeap::StrideFor(std::size_t bytes, std::size_t granularity) const {
  return RoundUp(RoundUp(bytes, 256) + options_.signal_bytes, granularity);
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
  const SymmetricHandle h{&e->a, e->generation};
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

constexpr std::uint32_t kRoundMagic = 0x434d4152;  // "CMAR"

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
          p, magic == kRoundMagic ? OpName(their_op) : "no collective of this heap", their_seq,
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

absl::StatusOr<SymmetricHeap::Agreed> SymmetricHeap::AgreeOnSize(std::size_t bytes,
                                                                 bool make_symmetric) {
  if (exchange_->process_count() == 1) {
    // Every member is in this process and shares this cache: there is no
    // one to agree with, and a hit stays a few map operations.
    if (bytes == 0) return absl::InvalidArgumentError("symmetric heap: cannot allocate 0 bytes");
    group_granularity_ = granularity_;
    Agreed out;
    out.bytes = bytes;
    out.candidates = {Candidate(StrideFor(bytes, group_granularity_))};
    return out;
  }
  // Without make_symmetric every member's stride is the agreed one (sizes
  // must match), so each names its candidate for it in the same round.
  // Before the first exchange the group's granularity is unknown, and the
  // cache is empty.
  const std::uint64_t candidate =
      make_symmetric || group_granularity_ == 0 ? 0
                                                : Candidate(StrideFor(bytes, group_granularity_));
  Contribution mine;
  symmetric_internal::Put(mine.bytes, static_cast<std::uint64_t>(bytes));
  symmetric_internal::Put(mine.bytes, static_cast<std::uint64_t>(granularity_));
  symmetric_internal::Put(mine.bytes, static_cast<std::uint8_t>(make_symmetric));
  symmetric_internal::Put(mine.bytes, candidate);
  // A bad request still joins the round, so that the others fail with it
  // now rather than wait out their timeout.
  const absl::Status local =
      bytes == 0 ? absl::InvalidArgumentError("symmetric heap: cannot allocate 0 bytes")
                 : absl::OkStatus();
  absl::StatusOr<std::vector<Contribution>> all = Round(Op::kSize, local, mine);
  if (!all.ok()) return all.status();
  std::uint64_t largest = 0, granularity = 0;
  std::vector<std::uint64_t> sizes;
  Agreed out;
  for (std::size_t p = 0; p < all->size(); ++p) {
    std::size_t pos = 0;
    std::uint64_t b = 0, g = 0, c = 0;
    std::uint8_t sym = 0;
    if (!symmetric_internal::Get((*all)[p].bytes, pos, b) || !symmetric_internal::Get((*all)[p].bytes, pos, g) ||
        !symmetric_internal::Get((*all)[p].bytes, pos, sym) || !symmetric_internal::Get((*all)[p].bytes, pos, c)) {
      return absl::DataLossError(absl::StrCat("symmetric heap: malformed size from process ", p));
    }
    if (static_cast<bool>(sym) != make_symmetric) {
      return absl::InvalidArgumentError(
          "symmetric heap: processes disagree on make_symmetric for one collective allocation");
    }
    sizes.push_back(b);
    out.candidates.push_back(c);
    largest = std::max(largest, b);
    granularity = std::max(granularity, g);
  }
  if (!make_symmetric && std::any_of(sizes.begin(), sizes.end(),
                                     [&](std::uint64_t s) { return s != sizes[0]; })) {
    std::string list;
    for (std::size_t p = 0; p < sizes.size(); ++p) {
      absl::StrAppend(&list, p ? ", " : "", "process ", p, ": ", sizes[p]);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "symmetric heap: members asked for different sizes (", list,
        "); pass make_symmetric to round every member up to the largest"));
  }
  group_granularity_ = granularity;
  out.bytes = static_cast<std::size_t>(largest);
  if (make_symmetric) {
    // The agreed stride is known only now: a second round names the
    // candidates for it.
    Contribution second;
    symmetric_internal::Put(second.bytes, Candidate(StrideFor(out.bytes, group_granularity_)));
    absl::StatusOr<std::vector<Contribution>> named =
        Round(Op::kCandidates, absl::OkStatus(), second);
    if (!named.ok()) return named.status();
    out.candidates.clear();
    for (std::size_t p = 0; p < named->size(); ++p) {
      std::size_t pos = 0;
      std::uint64_t c = 0;
      if (!symmetric_internal::Get((*named)[p].bytes, pos, c)) {
        return absl::DataLossError(
            absl::StrCat("symmetric heap: malformed cache candidate from process ", p));
      }
      out.candidates.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<SymmetricHandle> SymmetricHeap::Allocate(std::size_t bytes, bool make_symmetric) {
  MutexLock l(&mu_);
  if (exchange_->process_count() == 1 && bytes != 0 && group_granularity_ != 0) {
    // One process: its cache is the group's, so a hit needs no agreement.
    const std::size_t stride = StrideFor(bytes, group_granularity_);
    if (const std::uint64_t id = Candidate(stride); id != 0) return FromCache(bytes, stride, id);
  }
  absl::StatusOr<Agreed> agreed = AgreeOnSize(bytes, make_symmetric);
  if (!agreed.ok()) return agreed.status();
  const std::size_t stride = StrideFor(agreed->bytes, group_granularity_);
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

absl::StatusOr<SymmetricHeap::Entry*> SymmetricHeap::LiveEntry(const SymmetricHandle& handle,
                                                                const char* who) {
  auto it = live_.find(handle.allocation);
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
  // Written so that a huge offset or size cannot wrap around.
  if (offset > a.bytes || bytes > a.bytes - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: %s of bytes [%d, %d + %d) is past the allocation's %d bytes", who, offset,
        offset, bytes, a.bytes));
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
