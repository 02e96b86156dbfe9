// HostBackend's NVSHMEM emulation (HostBackendOptions::shmem_*): the PEs of
// one unique id share a POSIX shared-memory object, a header of per-PE
// slots where each posts its collective calls, then one heap per PE. The
// collectives are barriers over the slots, so that a PE that never joins
// is seen (after a timeout, where NVSHMEM would wait forever) and a PE that
// joins with another call is named (where NVSHMEM's behaviour is
// undefined): the symmetric heap's tests then show that cma only enters
// NVSHMEM's collectives once the group has agreed to.
//
// Also PeerCopy, the plain stream-ordered copy, checked against the
// memory this backend knows.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <chrono>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "backends/host/host_backend.h"
#include "backends/mutex_lock.h"

namespace cma {
namespace {

// The unique id: NVSHMEM's is 128 bytes beginning with a version int
// ((1 << 16) + 128, as NVSHMEMX_UNIQUEID_INITIALIZER sets it); the
// emulation's carries a magic, the heap size of the PE that made it and
// 16 random bytes that name the shared-memory object.
constexpr std::size_t kUniqueIdBytes = 128;
constexpr std::int32_t kUniqueIdVersion = (1 << 16) + 128;
constexpr std::uint32_t kUniqueIdMagic = 0x434d5348;  // "CMSH"
constexpr std::size_t kRandomBytes = 16;

constexpr int kMaxPes = 64;
constexpr std::size_t kHeaderBytes = std::size_t{64} << 10;
constexpr std::size_t kAlign = 512;  // what the first-fit hands out

// One PE's slot. `seq` is the number of collectives it has entered; its
// record of collective k is rec[k % 2] (a PE can be at most one collective
// ahead of the slowest: it waits for everyone at each).
struct CallRecord {
  std::uint64_t op, arg, result;
};
struct Slot {
  std::uint64_t seq;
  CallRecord rec[2];
};
static_assert(sizeof(Slot) * kMaxPes <= kHeaderBytes, "the header holds every slot");

enum Op : std::uint64_t { kInitOp = 1, kMallocOp, kFreeOp };
const char* OpName(std::uint64_t op) {
  switch (op) {
    case kInitOp: return "ShmemInit";
    case kMallocOp: return "ShmemMalloc";
    case kFreeOp: return "ShmemFree";
    default: return "an unknown call";
  }
}

constexpr std::uint64_t kNone = ~std::uint64_t{0};

absl::Status Errno(const char* call) {
  return absl::InternalError(absl::StrFormat("%s failed: %s", call, std::strerror(errno)));
}

}  // namespace

struct HostBackend::Shmem {
  int fd = -1;
  int pe = -1;
  int n_pes = 0;
  std::size_t heap_bytes = 0;
  bool reachable = true;
  Slot* slots = nullptr;        // the header, mapped
  char* heaps = nullptr;        // reachable: every PE's heap, PE p at p * heap_bytes
  char* own = nullptr;          // this PE's heap
  std::uint64_t seq = 0;        // collectives entered
  absl::Status broken;          // once set, every call fails with it
  std::map<std::size_t, std::size_t> free_list;  // offset -> bytes
  std::map<std::size_t, std::size_t> live;       // offset -> bytes
  absl::Duration timeout;

  ~Shmem() {
    if (heaps != nullptr) {
      munmap(heaps, static_cast<std::size_t>(n_pes) * heap_bytes);
    } else if (own != nullptr) {
      munmap(own, heap_bytes);
    }
    if (slots != nullptr) munmap(slots, kHeaderBytes);
    if (fd >= 0) close(fd);
  }

  // Enters collective `op` with this PE's `arg` and `result`; OK once every
  // PE has entered it with the same three.
  absl::Status Collective(std::uint64_t op, std::uint64_t arg, std::uint64_t result) {
    const std::uint64_t k = ++seq;
    Slot& me = slots[pe];
    me.rec[k % 2] = {op, arg, result};
    __atomic_store_n(&me.seq, k, __ATOMIC_RELEASE);
    const absl::Time deadline = absl::Now() + timeout;
    for (int p = 0; p < n_pes; ++p) {
      int spins = 0;
      while (__atomic_load_n(&slots[p].seq, __ATOMIC_ACQUIRE) < k) {
        if (++spins < 1000) continue;
        if (absl::Now() > deadline) {
          broken = absl::DeadlineExceededError(absl::StrFormat(
              "%s: PE %d of %d did not join collective #%d within %s: NVSHMEM would wait here "
              "forever (every PE must make the same collective call)",
              OpName(op), p, n_pes, k, absl::FormatDuration(timeout)));
          return broken;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    for (int p = 0; p < n_pes; ++p) {
      const CallRecord r = slots[p].rec[k % 2];
      if (r.op != op || r.arg != arg || r.result != result) {
        broken = absl::FailedPreconditionError(absl::StrFormat(
            "collective #%d: PE %d called %s(%d) (result %d) while PE %d called %s(%d) (result "
            "%d): in NVSHMEM that is undefined behaviour; the emulated NVSHMEM is now unusable",
            k, pe, OpName(op), arg, result, p, OpName(r.op), r.arg, r.result));
        return broken;
      }
    }
    return absl::OkStatus();
  }

  // The heap offset of `ptr` (a local address), or kNone.
  std::size_t OffsetOf(const void* ptr) const {
    const char* c = static_cast<const char*>(ptr);
    return c >= own && c < own + heap_bytes ? static_cast<std::size_t>(c - own) : kNone;
  }

  // Whether [off, off + bytes) lies inside one live allocation.
  bool InLive(std::size_t off, std::size_t bytes) const {
    auto it = live.upper_bound(off);
    if (it == live.begin()) return false;
    --it;
    return off - it->first <= it->second && bytes <= it->second - (off - it->first);
  }
};

void HostBackend::ShmemDeleter::operator()(Shmem* s) const { delete s; }

int HostBackend::ShmemLiveAllocations() const {
  MutexLock l(&shmem_mu_);
  return shmem_ == nullptr ? 0 : static_cast<int>(shmem_->live.size());
}

absl::StatusOr<Backend::ShmemState> HostBackend::ShmemQueryState() {
  MutexLock l(&shmem_mu_);
  ShmemState s;
  if (shmem_ != nullptr) s = {true, shmem_->pe, shmem_->n_pes};
  return s;
}

absl::StatusOr<std::string> HostBackend::ShmemUniqueId() {
  {
    MutexLock l(&mu_);
    Count("ShmemUniqueId");
  }
  if (options_.shmem_heap_bytes == 0 || options_.shmem_heap_bytes % kHeaderBytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ShmemUniqueId: shmem_heap_bytes (%d) must be a positive multiple of 64 KiB",
        options_.shmem_heap_bytes));
  }
  std::string id(kUniqueIdBytes, '\0');
  std::memcpy(&id[0], &kUniqueIdVersion, 4);
  std::memcpy(&id[4], &kUniqueIdMagic, 4);
  const std::uint64_t heap = options_.shmem_heap_bytes;
  std::memcpy(&id[8], &heap, 8);
  if (getrandom(&id[16], kRandomBytes, 0) != static_cast<ssize_t>(kRandomBytes)) {
    return Errno("ShmemUniqueId: getrandom");
  }
  return id;
}

absl::Status HostBackend::ShmemInit(const std::string& unique_id, int pe, int n_pes, int device) {
  MutexLock l(&shmem_mu_);
  {
    MutexLock m(&mu_);
    Count("ShmemInit");
    if (auto s = CheckDevice(device); !s.ok()) return s;
  }
  if (shmem_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "ShmemInit: NVSHMEM is initialised already in this process (PE %d of %d)", shmem_->pe,
        shmem_->n_pes));
  }
  if (n_pes < 1 || n_pes > kMaxPes || pe < 0 || pe >= n_pes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ShmemInit: PE %d of %d (the emulation serves 1 to %d PEs)", pe, n_pes, kMaxPes));
  }
  std::int32_t version = 0;
  std::uint32_t magic = 0;
  std::uint64_t heap = 0;
  if (unique_id.size() == kUniqueIdBytes) {
    std::memcpy(&version, &unique_id[0], 4);
    std::memcpy(&magic, &unique_id[4], 4);
    std::memcpy(&heap, &unique_id[8], 8);
  }
  if (version != kUniqueIdVersion || magic != kUniqueIdMagic || heap == 0 ||
      heap % kHeaderBytes != 0 || heap > (std::uint64_t{1} << 40)) {
    return absl::InvalidArgumentError(
        "ShmemInit: not a unique id from this emulation's ShmemUniqueId (128 bytes)");
  }
  std::string name = "/cma-shmem-";
  for (std::size_t i = 0; i < kRandomBytes; ++i) {
    absl::StrAppendFormat(&name, "%02x", static_cast<unsigned char>(unique_id[16 + i]));
  }
  auto s = std::make_unique<Shmem>();
  s->pe = pe;
  s->n_pes = n_pes;
  s->heap_bytes = heap;
  s->reachable = !options_.shmem_unreachable;
  s->timeout = absl::Seconds(options_.shmem_timeout_seconds);
  s->fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s->fd < 0) return Errno("ShmemInit: shm_open");
  const std::size_t total = kHeaderBytes + static_cast<std::size_t>(n_pes) * heap;
  struct stat st {};
  // Every PE sizes the object; only ever up, so that a PE that got there
  // first keeps what it mapped (PEs that disagree on n_pes fail the
  // barrier below before they touch a heap).
  if (fstat(s->fd, &st) != 0) return Errno("ShmemInit: fstat");
  if (static_cast<std::size_t>(st.st_size) < total && ftruncate(s->fd, total) != 0) {
    shm_unlink(name.c_str());
    return Errno("ShmemInit: ftruncate");
  }
  void* header = mmap(nullptr, kHeaderBytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
  if (header == MAP_FAILED) return Errno("ShmemInit: mmap");
  s->slots = static_cast<Slot*>(header);
  if (s->reachable) {
    void* all = mmap(nullptr, static_cast<std::size_t>(n_pes) * heap, PROT_READ | PROT_WRITE,
                     MAP_SHARED, s->fd, kHeaderBytes);
    if (all == MAP_FAILED) return Errno("ShmemInit: mmap");
    s->heaps = static_cast<char*>(all);
    s->own = s->heaps + static_cast<std::size_t>(pe) * heap;
  } else {
    void* mine = mmap(nullptr, heap, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd,
                      kHeaderBytes + static_cast<std::size_t>(pe) * heap);
    if (mine == MAP_FAILED) return Errno("ShmemInit: mmap");
    s->own = static_cast<char*>(mine);
  }
  s->free_list[0] = heap;
  const absl::Status joined = s->Collective(kInitOp, static_cast<std::uint64_t>(n_pes), heap);
  // Every PE that got here opened the object: its name can go (on failure
  // too: a PE that never came must not find it later).
  shm_unlink(name.c_str());
  if (!joined.ok()) return joined;
  shmem_.reset(s.release());
  return absl::OkStatus();
}

absl::StatusOr<void*> HostBackend::ShmemMalloc(std::size_t bytes) {
  MutexLock l(&shmem_mu_);
  {
    MutexLock m(&mu_);
    Count("ShmemMalloc");
  }
  if (shmem_ == nullptr) return absl::FailedPreconditionError("ShmemMalloc: NVSHMEM is not initialised");
  Shmem& s = *shmem_;
  if (!s.broken.ok()) return s.broken;
  // The same first-fit on every PE, from the same history, gives the same
  // offset: the barrier checks that it did.
  const std::size_t want = bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
  std::size_t off = kNone;
  for (auto& [o, n] : s.free_list) {
    if (n >= want) {
      off = o;
      break;
    }
  }
  if (absl::Status j = s.Collective(kMallocOp, bytes, off); !j.ok()) return j;
  if (off == kNone) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "ShmemMalloc(%d): the emulated symmetric heap (%d bytes per PE) has no room", bytes,
        s.heap_bytes));
  }
  const std::size_t have = s.free_list[off];
  s.free_list.erase(off);
  if (have > want) s.free_list[off + want] = have - want;
  s.live[off] = want;
  return s.own + off;
}

absl::Status HostBackend::ShmemFree(void* ptr) {
  MutexLock l(&shmem_mu_);
  {
    MutexLock m(&mu_);
    Count("ShmemFree");
  }
  if (shmem_ == nullptr) return absl::FailedPreconditionError("ShmemFree: NVSHMEM is not initialised");
  Shmem& s = *shmem_;
  if (!s.broken.ok()) return s.broken;
  // A pointer that is not a live allocation still joins, as kNone, so that
  // every PE sees the mismatch rather than wait.
  std::size_t off = s.OffsetOf(ptr);
  if (off != kNone && s.live.count(off) == 0) off = kNone;
  if (absl::Status j = s.Collective(kFreeOp, off, 0); !j.ok()) return j;
  if (off == kNone) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ShmemFree: %p is not a live allocation of the symmetric heap", ptr));
  }
  std::size_t n = s.live[off];
  s.live.erase(off);
  // Merged with its free neighbours, so that the heap does not fragment.
  auto next = s.free_list.find(off + n);
  if (next != s.free_list.end()) {
    n += next->second;
    s.free_list.erase(next);
  }
  auto it = s.free_list.lower_bound(off);
  if (it != s.free_list.begin() && std::prev(it)->first + std::prev(it)->second == off) {
    std::prev(it)->second += n;
  } else {
    s.free_list[off] = n;
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> HostBackend::ShmemPeerPointer(void* ptr, int pe) {
  MutexLock l(&shmem_mu_);
  if (shmem_ == nullptr) {
    return absl::FailedPreconditionError("ShmemPeerPointer: NVSHMEM is not initialised");
  }
  const Shmem& s = *shmem_;
  const std::size_t off = s.OffsetOf(ptr);
  if (off == kNone || pe < 0 || pe >= s.n_pes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ShmemPeerPointer: %p is not in the symmetric heap, or PE %d is not one of %d", ptr, pe,
        s.n_pes));
  }
  if (pe == s.pe) return ptr;
  if (!s.reachable) return nullptr;
  return s.heaps + static_cast<std::size_t>(pe) * s.heap_bytes + off;
}

absl::Status HostBackend::ShmemCheckStream(Stream stream) {
  MutexLock m(&mu_);
  return FindStream(stream).status();
}

absl::Status HostBackend::ShmemTransfer(bool put, void* dst, const void* src, std::size_t bytes,
                                        int pe, Stream stream) {
  const char* call = put ? "ShmemPut" : "ShmemGet";
  MutexLock l(&shmem_mu_);
  {
    MutexLock m(&mu_);
    Count(call);
    if (auto st = FindStream(stream); !st.ok()) return st.status();
  }
  if (shmem_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(call, ": NVSHMEM is not initialised"));
  }
  const Shmem& s = *shmem_;
  if (!s.broken.ok()) return s.broken;
  // The symmetric side: a local address naming every PE's copy.
  const void* sym = put ? dst : src;
  const std::size_t off = s.OffsetOf(sym);
  if (off == kNone || !s.InLive(off, bytes) || pe < 0 || pe >= s.n_pes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: [%p, +%d) is not inside one symmetric allocation, or PE %d is not one of %d", call,
        sym, bytes, pe, s.n_pes));
  }
  if (pe == s.pe || s.reachable) {
    char* there = (pe == s.pe ? s.own : s.heaps + static_cast<std::size_t>(pe) * s.heap_bytes) + off;
    if (put) {
      std::memmove(there, src, bytes);
    } else {
      std::memmove(dst, there, bytes);
    }
    return absl::OkStatus();
  }
  // Not mapped here: through the object's descriptor, as a network would.
  const off_t at = static_cast<off_t>(kHeaderBytes + static_cast<std::size_t>(pe) * s.heap_bytes + off);
  std::size_t done = 0;
  while (done < bytes) {
    const ssize_t n = put ? pwrite(s.fd, static_cast<const char*>(src) + done, bytes - done, at + done)
                          : pread(s.fd, static_cast<char*>(dst) + done, bytes - done, at + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Errno(put ? "ShmemPut: pwrite" : "ShmemGet: pread");
    done += static_cast<std::size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status HostBackend::ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                                   Stream stream) {
  return ShmemTransfer(true, dst, src, bytes, pe, stream);
}

absl::Status HostBackend::ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                                   Stream stream) {
  return ShmemTransfer(false, dst, const_cast<void*>(src), bytes, pe, stream);
}

absl::Status HostBackend::ShmemQuiet(Stream stream) {
  {
    MutexLock m(&mu_);
    Count("ShmemQuiet");
  }
  MutexLock l(&shmem_mu_);
  if (shmem_ == nullptr) return absl::FailedPreconditionError("ShmemQuiet: NVSHMEM is not initialised");
  // Every put and get here completes at once.
  return ShmemCheckStream(stream);
}

bool HostBackend::InCopyable(const void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto inside = [&](std::uintptr_t base, std::size_t n) {
    return a >= base && a - base <= n && bytes <= n - (a - base);
  };
  if (auto it = mappings_.upper_bound(a); it != mappings_.begin() &&
                                          inside(std::prev(it)->first, std::prev(it)->second.bytes)) {
    return true;
  }
  if (auto it = managed_.upper_bound(a);
      it != managed_.begin() && inside(std::prev(it)->first, std::prev(it)->second.bytes)) {
    return true;
  }
  if (InPinned(p, bytes)) return true;
  if (shmem_ != nullptr) {
    const Shmem& s = *shmem_;
    if (s.heaps != nullptr) {
      return inside(reinterpret_cast<std::uintptr_t>(s.heaps),
                    static_cast<std::size_t>(s.n_pes) * s.heap_bytes);
    }
    return inside(reinterpret_cast<std::uintptr_t>(s.own), s.heap_bytes);
  }
  return false;
}

absl::Status HostBackend::PeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) {
  MutexLock l(&shmem_mu_);
  MutexLock m(&mu_);
  Count("PeerCopy");
  if (auto st = FindStream(stream); !st.ok()) return st.status();
  if (bytes == 0) return absl::OkStatus();
  // One side must be memory this backend made (the symmetric side: a
  // mapping, the NVSHMEM heap, managed or pinned memory); the other may be
  // any host memory, as cudaMemcpyDefault accepts pageable memory.
  if (!InCopyable(dst, bytes) && !InCopyable(src, bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PeerCopy: neither [%p, +%d) nor [%p, +%d) lies inside one mapping, managed allocation, "
        "pinned buffer or the symmetric heap",
        dst, bytes, src, bytes));
  }
  std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

}  // namespace cma
