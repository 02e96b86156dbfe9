#include "backends/mutex_lock.h"
#include "allocator/symmetric/symmetric_heap.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/symmetric/handle_choice.h"
#include "allocator/symmetric/pair_handles.h"

namespace cma {
namespace {

using symmetric_internal::ExportPerPair;
using symmetric_internal::Get;
using symmetric_internal::Put;
using symmetric_internal::ImportPerPair;
using symmetric_internal::StepClock;

std::size_t RoundUp(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

bool EnvIs(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SymmetricHeap>> SymmetricHeap::Create(
    Backend& backend, SymmetricGroup group, std::unique_ptr<Exchange> exchange,
    SymmetricOptions options) {
  if (exchange == nullptr) return absl::InvalidArgumentError("symmetric heap: no exchange");
  if (group.world_size < 1 || group.local_ranks.empty() ||
      group.local_ranks.size() != group.local_devices.size()) {
    return absl::InvalidArgumentError(
        "symmetric heap: a group needs world_size >= 1 and one device per local rank");
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
    case 6: return "RegisterWindow";
    case 7: return "RegisterWindow (commit)";
    case 8: return "ReleaseWindows";
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
  Put(tagged, kRoundMagic);
  Put(tagged, static_cast<std::uint8_t>(op));
  Put(tagged, static_cast<std::uint8_t>(local.ok()));
  Put(tagged, seq);
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
    if (!Get(c.bytes, pos, magic) || !Get(c.bytes, pos, their_op) || !Get(c.bytes, pos, ok) ||
        !Get(c.bytes, pos, their_seq) || magic != kRoundMagic || their_op != static_cast<std::uint8_t>(op) ||
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
  Put(mine.bytes, static_cast<std::uint64_t>(bytes));
  Put(mine.bytes, static_cast<std::uint64_t>(granularity_));
  Put(mine.bytes, static_cast<std::uint8_t>(make_symmetric));
  Put(mine.bytes, candidate);
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
    if (!Get((*all)[p].bytes, pos, b) || !Get((*all)[p].bytes, pos, g) ||
        !Get((*all)[p].bytes, pos, sym) || !Get((*all)[p].bytes, pos, c)) {
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
    Put(second.bytes, Candidate(StrideFor(out.bytes, group_granularity_)));
    absl::StatusOr<std::vector<Contribution>> named =
        Round(Op::kCandidates, absl::OkStatus(), second);
    if (!named.ok()) return named.status();
    out.candidates.clear();
    for (std::size_t p = 0; p < named->size(); ++p) {
      std::size_t pos = 0;
      std::uint64_t c = 0;
      if (!Get((*named)[p].bytes, pos, c)) {
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
  Put(mine.bytes, static_cast<std::uint32_t>(group_.local_ranks.size()));
  // This process's handle type (a fabric heap may have fallen back to FDs);
  // across hosts, 2: a handle per pair, and this process's fabric domain.
  Put(mine.bytes, static_cast<std::uint32_t>(multi_host ? 2 : handle_type_ == HandleType::kFabric ? 1 : 0));
  if (multi_host) {
    Put(mine.bytes, static_cast<std::uint8_t>(fabric_domain_.size()));
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
    Put(mine.bytes, static_cast<std::int32_t>(r));
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
      if (!Get(c.bytes, pos, n) || !Get(c.bytes, pos, type) || type > 2 ||
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
        if (!Get(c.bytes, pos, r) || pos + sizeof(sh.fabric) > c.bytes.size() || r < 0 ||
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
  if (local.ok()) {
    absl::StatusOr<void*> table =
        backend_.AllocateManaged(group_.local_devices[0], world * sizeof(void*));
    if (table.ok()) {
      a.device_peers = *table;
    } else {
      local = table.status();
    }
  }

  // 6. Everyone mapped everything, or everyone undoes it: a member that
  // failed to import or map says so, and no member keeps an allocation that
  // another lacks.
  if (multi_process) {
    absl::StatusOr<std::vector<Contribution>> commit = Round(Op::kCommit, local, {});
    if (!commit.ok()) return fail(commit.status());
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
    char* p = unreachable[r] ? nullptr : static_cast<char*>(a.base) + r * stride;
    a.peers.push_back(p);
    a.signals.push_back(p != nullptr ? p + stride - options_.signal_bytes : nullptr);
    static_cast<void**>(a.device_peers)[r] = p;
  }
  if (!unreachable_why.empty()) {
    a.unreachable = absl::StrCat(
        "no peer pointer (peers[r] is null) for: ", absl::StrJoin(unreachable_why, "; "),
        ". Only members of this host (POSIX FDs) and of this NVLink domain (fabric handles) are "
        "mapped; an NVSHMEM or NCCL-window provider for the others is not built");
  }
  return e;
}

absl::StatusOr<SymmetricHeap::Entry*> SymmetricHeap::LiveEntry(const SymmetricHandle& handle,
                                                                const char* what) {
  // By address alone first (a stale or foreign pointer is never read), then
  // by generation: a cache hit hands the same allocation out again, and a
  // new one may be built where an emptied one was.
  auto it = live_.find(handle.allocation);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "symmetric heap: ", what, " of an allocation that is not live here (a double free or "
        "a use after free, a null handle, or a pointer this heap did not hand out)"));
  }
  if (it->second->generation != handle.generation) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "symmetric heap: %s of a stale handle (generation %d; allocation %d is live again as "
        "generation %d): it was freed already and handed out again",
        what, handle.generation, it->second->a.id, it->second->generation));
  }
  return it->second.get();
}

absl::Status SymmetricHeap::Free(const SymmetricHandle& handle) {
  MutexLock l(&mu_);
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

absl::Status SymmetricHeap::EmptyCache() {
  MutexLock l(&mu_);
  // Collective: all processes drop the same entries, keeping caches identical.
  absl::StatusOr<std::vector<Contribution>> barrier =
      Round(Op::kEmptyCache, absl::OkStatus(), Contribution{});
  if (!barrier.ok()) return barrier.status();
  PublishEmptied();
  for (auto& [key, e] : cache_) {
    if (!Destroy(*e)) leftovers_.push_back(std::move(e));
  }
  cache_.clear();
  ReleaseNonDumpableIfEmpty();
  return absl::OkStatus();
}

bool SymmetricHeap::Destroy(Entry& e) {
  SymmetricAllocation& a = e.a;
  DropWindows(e);  // the library lets go of this memory before it is unmapped
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
