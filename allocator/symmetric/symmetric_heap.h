// SymmetricHeap: collective allocations that every member of a group of GPUs
// (in one process or several) can read and write directly, on the Backend's
// VMM calls, cached like ordinary blocks.
//
// A group has `world_size` members (ranks); this process serves some of them
// (`local_ranks`, each on `local_devices[i]`). One SymmetricHeap per process.
// Allocate returns the same-size buffer for every member: this process's
// pointer to each member's buffer (one contiguous reservation, member r at
// r * stride), a device-readable array of those pointers for kernels, and a
// small signal area per member.
//
// Contract:
//  * Allocate, Free and EmptyCache are collective: every process of the group
//    calls them, in the same order. Free puts the allocation in the cache;
//    a later Allocate whose stride matches reuses it with no driver call.
//    Across processes, every Allocate exchanges a few bytes (one round; two
//    with make_symmetric), so that the group decides together: the members agree
//    on the size and on which cached allocation to reuse, named by its
//    collective id (the same on every process, whatever order the frees came
//    in); when any member has none, or they name different ones, every member
//    builds a new allocation. So every member always gets the same
//    allocation.
//  * Sizes must match across members unless make_symmetric is set, which
//    rounds every member up to the largest request; a mismatch, cache hit or
//    miss, is kInvalidArgument on every process. Every member derives the
//    group's size and stride itself from every member's request (never from
//    one member's word); a size whose stride (or the reservation of
//    world_size strides) overflows is kInvalidArgument ("too large") and
//    changes nothing; the build's last round checks that every member built
//    the same size and stride.
//  * Create is collective across processes (one round): every process's
//    verdict on its own arguments, so that one with a bad rank, device or
//    option fails every process at once, naming it; the members must agree
//    on world_size, the provider and signal_bytes (kInvalidArgument naming
//    those that differ); non_dumpable is the group's strictest choice.
//  * The signal area of member r is the last signal_bytes of its stride, so
//    it stays in place when a cached allocation is reused with another size.
//  * Allocate returns a SymmetricHandle: the allocation and the generation
//    of this hand-out (a number this heap never hands out twice). A cache
//    hit hands the same SymmetricAllocation out again, and a new allocation
//    may land at a freed one's address, so Free takes the handle and refuses
//    (kInvalidArgument) one whose generation is not the live one or that
//    another heap handed out (SymmetricHandle::heap): a stale handle, a
//    double free, another heap's handle, or a pointer this heap did not
//    hand out is refused on every member, is never dereferenced, and
//    changes nothing.
//  * Every exchange is bounded by the Exchange's timeout: a dead member gives
//    the others an error, never a hang, and nothing leaks.
//  * Members fail together: a member whose part of a collective fails (a
//    driver call, an import, a map) still joins its round with the reason,
//    so every member gets an error naming it (kAborted on the others) and
//    undoes its part; no member keeps an allocation another lacks. Rounds
//    carry their operation and sequence number: members whose calls are out
//    of step get kFailedPrecondition naming both operations. After an
//    exchange failure or calls out of step, the group's state is unknown:
//    every later collective fails at once (kFailedPrecondition, naming the
//    first failure); create a new heap.
//  * Across hosts (an exchange from MakeMultiHostExchange, host_count() > 1),
//    each pair is served as it can be: members of this host through POSIX
//    FDs (or the fabric handle where the memory exports no FD), members of
//    other hosts in this process's NVLink domain (DeviceFacts::fabric_domain;
//    a fabric heap only) through fabric handles, and the others not at all:
//    their peers[r] is null and SymmetricAllocation::unreachable says why.
//    No error, and the allocation is the same collective one on everyone.
//  * Communicator windows (RegisterWindow): a member's buffer, signal area
//    included, registered as a symmetric window of a collective library's
//    communicator (NCCL's ncclCommWindowRegister), so that the library's
//    symmetric collectives run on it. Collective like Allocate, and
//    fail-together: the members agree first (same allocation, the
//    communicator's rank, size and device are this member's), then
//    register, then agree on the outcome; on any failure every member
//    deregisters what it made. A registration is cached with its
//    allocation: freed, reused from the cache, and registered again, it
//    costs no exchange and no library call. It is released (locally: NCCL's
//    deregistration makes no exchange) when its allocation's memory is, by
//    EmptyCache or the heap's destruction, or by ReleaseWindows, which every
//    member must call before the framework destroys the communicator.
//  * Multicast is used only when options ask for it, every device reports
//    support and none of CMA_DISABLE_MULTICAST=1,
//    TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NCCL_NVLS_ENABLE=0 is set.
//  * Providers (SymmetricOptions::provider): kVmm (the default: the
//    Backend's VMM calls, handles exchanged as above) or kNvshmem (the
//    Backend's Shmem* calls: NVSHMEM's symmetric heap; symmetric_nvshmem.cc).
//    Caching, statistics, snapshots, the rounds and their fail-together
//    rules are the same; only building and destroying an allocation differ.
//    NVSHMEM serves one member (PE) per process, one device per PE, member r
//    in process r: Create refuses any other shape (kInvalidArgument, on
//    every process). Create is then collective: the processes agree on
//    whether NVSHMEM needs initialising (or is initialised already in this
//    shape, by an earlier heap or by torch, and is shared), process 0's
//    unique id travels over this heap's exchange (authenticated), and every
//    process initialises NVSHMEM only once all have agreed to. NVSHMEM's
//    allocate and free are collective and block inside NVSHMEM, so a miss
//    takes one more round (every member ready: its local steps done) before
//    any member calls it, and EmptyCache frees only the allocations cached on
//    every member, in collective-id order. peers[r] is NVSHMEM's load/store
//    pointer (nvshmem_ptr) or null where member r is not reachable that way
//    (then `unreachable` says so, and Put/Get reach it). The destructor cannot
//    free NVSHMEM memory (NVSHMEM's free is collective): free and EmptyCache
//    first, or it stays in NVSHMEM's heap until the process exits.
//    If NVSHMEM's allocate fails on some members and not others (NVSHMEM
//    does not say it can), the members that got memory cannot give it back
//    alone: every member breaks the heap, as after an exchange failure.
//  * Put and Get (not collective) copy between local memory and member r's
//    buffer in a stream's order: a PeerCopy through peers[r] when it is
//    mapped here, NVSHMEM's put/get (then quiet) otherwise; kUnavailable for
//    a VMM allocation whose member r has no mapping here.
// Thread safety: methods are serialised internally; collective order is the
// caller's to keep. Returned allocations stay valid until freed.
#ifndef CMA_ALLOCATOR_SYMMETRIC_SYMMETRIC_HEAP_H_
#define CMA_ALLOCATOR_SYMMETRIC_SYMMETRIC_HEAP_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/symmetric/exchange.h"
#include "backends/backend.h"

namespace cma {

struct SymmetricGroup {
  int world_size = 1;
  std::vector<int> local_ranks;    // members this process serves
  std::vector<int> local_devices;  // the device of each local member
};

// Where a heap's memory comes from (see the contract above).
enum class SymmetricProvider { kVmm, kNvshmem };
const char* SymmetricProviderName(SymmetricProvider p);

struct SymmetricOptions {
  SymmetricProvider provider = SymmetricProvider::kVmm;
  // How this process's memory travels to the others: POSIX FDs (processes
  // of one host) or fabric handles (multi-node NVLink, CUDA only). A fabric
  // heap probes each local device at Create with a real allocation, exported
  // and released (the device attribute can say yes while creation or export
  // fails, as CUDA does without an IMEX channel); a device that fails makes
  // Create kUnimplemented naming it, unless fabric_fallback, which uses
  // POSIX FDs instead (handle_type() and handle_fallback_reason() tell).
  // Each process announces its choice with its handles, and imports each
  // member's as that member sent it.
  HandleType handle_type = HandleType::kPosixFd;
  bool fabric_fallback = false;
  std::size_t signal_bytes = 256;  // per member, after its buffer
  bool multicast = false;          // opt-in; see the contract above
  // Hardening: while this heap holds symmetric memory (live or cached), the
  // process is non-dumpable (prctl PR_SET_DUMPABLE 0), so that another
  // process of this user, token or not, cannot read or write the buffers
  // through /proc/PID/mem or ptrace (nor find them in a core dump; debuggers
  // cannot attach meanwhile; root still can). Counted process-wide: the
  // setting found before the first such heap took memory comes back when
  // the last one holds none (2, suid_dumpable's value, comes back as 1:
  // prctl cannot set 2). A failure to set it fails the Allocate on every
  // member, like any local failure. Agreed at Create: every member maps
  // every other's memory, so if any member asks for it, every member of
  // the group holds it.
  bool non_dumpable = false;
};

struct SymmetricAllocation {
  std::uint64_t id = 0;  // collective: the same on every member
  std::size_t bytes = 0;   // usable bytes per member (the group's request)
  std::size_t stride = 0;  // distance between members' buffers
  std::vector<void*> peers;    // peers[r]: member r's buffer, mapped in this process
  std::vector<void*> signals;  // signals[r]: member r's signal area (its stride's last bytes)
  void* device_peers = nullptr;  // world_size pointers, readable by kernels
  bool multicast = false;
  MulticastHandle multicast_handle = 0;
  void* base = nullptr;  // VMM: the reservation, world_size * stride bytes; NVSHMEM: null
  // Empty when every peer is mapped; otherwise which members have no
  // pointer here (peers[r], signals[r] and device_peers[r] null: across
  // hosts (multi_host.h), on another host outside this process's NVLink
  // domain; with NVSHMEM, not reachable by load/store) and why.
  std::string unreachable;
};

struct SymmetricStats {
  std::int64_t allocations = 0;
  std::int64_t cache_hits = 0;
  std::int64_t exchanges = 0;
  std::int64_t symmetric_bytes = 0;       // physical bytes this process created, cached included
  std::int64_t symmetric_bytes_peak = 0;
  std::int64_t cached_bytes = 0;
  std::int64_t windows = 0;  // communicator windows registered, on live and cached allocations
  // Seconds spent in each backend call on the last cache miss
  // ("VmmCreate", "VmmExport", "exchange", "VmmImport", "VmmMap", ...).
  std::map<std::string, double> last_miss_seconds;
};

// What Allocate hands out: `allocation` stays valid until this handle is
// freed; `generation` names this hand-out, so that Free can tell this
// owner from a later one of the same allocation; `heap` names the heap that
// handed it out (a number unique in this process: generations restart in
// every heap, and a new heap's allocation may sit at the address of another
// heap's freed one), so that a heap refuses every other heap's handles.
// Copyable; keep the copy you free with.
struct SymmetricHandle {
  const SymmetricAllocation* allocation = nullptr;
  std::uint64_t generation = 0;
  std::uint64_t heap = 0;

  const SymmetricAllocation* operator->() const { return allocation; }
  const SymmetricAllocation& operator*() const { return *allocation; }
};

// One allocation as a snapshot sees it.
struct SymmetricSnapshot {
  std::uint64_t id = 0;
  std::size_t bytes = 0;   // per member
  std::size_t stride = 0;  // per member, as reserved
  bool cached = false;     // freed, kept for reuse
  std::vector<void*> peers;
};

class SymmetricHeap {
 public:
  // `backend` must outlive the heap.
  static absl::StatusOr<std::unique_ptr<SymmetricHeap>> Create(Backend& backend,
                                                               SymmetricGroup group,
                                                               std::unique_ptr<Exchange> exchange,
                                                               SymmetricOptions options = {});
  // Releases everything this process mapped or created (not collective).
  ~SymmetricHeap();

  absl::StatusOr<SymmetricHandle> Allocate(std::size_t bytes, bool make_symmetric = false);
  // Not a round: every member frees locally, in the collective order.
  absl::Status Free(const SymmetricHandle& handle);
  absl::Status EmptyCache();

  // Collective: registers this process's member buffer of `handle` (all of
  // its stride) as a symmetric window of `comm` and returns the window.
  // Needs one local member per process (as NCCL has one rank per
  // communicator and process here). Errors, on every member together:
  // kInvalidArgument for a stale or foreign handle, a communicator whose
  // rank, size or device is not this member's, or members naming different
  // allocations; kUnimplemented when the backend has no such library (or
  // the library registered no window); the library's error otherwise.
  absl::StatusOr<CommWindow> RegisterWindow(const SymmetricHandle& handle, CommHandle comm);
  // Collective: deregisters every window on `comm` (of live and cached
  // allocations); returns how many this process released. Call it on every
  // member while `comm` is alive, before the framework destroys it.
  absl::StatusOr<int> ReleaseWindows(CommHandle comm);

  // Not collective: copies `bytes` from local device memory `src` into
  // member `rank`'s buffer at `offset` (Put), or from there into `dst`
  // (Get), in `stream`'s order (see the contract). kInvalidArgument, with
  // nothing copied, for a handle that is not live (as Free), a rank out of
  // range, [offset, offset + bytes) past the allocation's bytes or past the
  // mapped stride less its signal area (checked without wrapping), or a
  // null local pointer; 0 bytes copy nothing.
  absl::Status Put(const SymmetricHandle& handle, int rank, std::size_t offset, const void* src,
                   std::size_t bytes, Stream stream = kDefaultStream);
  absl::Status Get(const SymmetricHandle& handle, int rank, std::size_t offset, void* dst,
                   std::size_t bytes, Stream stream = kDefaultStream);
  // Statistics and the snapshot never wait on a collective (another
  // thread's Allocate or EmptyCache may be waiting on other processes for up
  // to the exchange's timeout): they return at once the state as of the end
  // of the last Allocate, Free or EmptyCache, except `exchanges`, which
  // counts rounds as they start. Any thread may call them at any time.
  SymmetricStats GetStats();
  // Live allocations, then cached ones, each in collective-id order.
  std::vector<SymmetricSnapshot> Snapshot();

  // The handle type this process exports (options.handle_type, or kPosixFd
  // after a fabric fallback), and why it fell back (empty if it did not).
  // Fixed at Create: any thread, any time.
  HandleType handle_type() const { return handle_type_; }
  SymmetricProvider provider() const { return options_.provider; }
  const std::string& handle_fallback_reason() const { return handle_fallback_reason_; }

 private:
  SymmetricHeap(Backend& backend, SymmetricGroup group, std::unique_ptr<Exchange> exchange,
                SymmetricOptions options, std::size_t granularity, HandleType handle_type,
                std::string handle_fallback_reason)
      : backend_(backend),
        group_(std::move(group)),
        exchange_(std::move(exchange)),
        options_(options),
        granularity_(granularity),
        handle_type_(handle_type),
        handle_fallback_reason_(std::move(handle_fallback_reason)),
        id_(NextHeapId()) {}
  // A number no other heap of this process has (SymmetricHandle::heap).
  static std::uint64_t NextHeapId();

  // Create's checks of the group's shape and the options that need no
  // backend: kInvalidArgument naming the problem.
  static absl::Status CheckGroup(const SymmetricGroup& group, const SymmetricOptions& options);
  // Create's round (symmetric_agree.cc), across processes: every process's
  // verdict on its own arguments (`local`), so that one that refuses fails
  // every process at once, naming it; and the options every member must
  // share (world size, provider, signal_bytes: kInvalidArgument naming the
  // processes that differ) or that the group takes at its strictest
  // (non_dumpable: any member's asks it of all, since every member maps
  // every other's memory). In one process: `local`, and this process's
  // options.
  absl::Status AgreeOnCreate(const absl::Status& local) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Create for the NVSHMEM provider (symmetric_nvshmem.cc).
  static absl::StatusOr<std::unique_ptr<SymmetricHeap>> CreateShmem(
      Backend& backend, SymmetricGroup group, std::unique_ptr<Exchange> exchange,
      SymmetricOptions options);

  struct Entry {
    SymmetricAllocation a;
    std::size_t own_bytes = 0;  // physical bytes created here
    std::vector<PhysicalHandle> unreleased;  // releases that failed: retried at teardown
    std::uint64_t generation = 0;  // of the current hand-out while live
    // Communicator windows on this member's buffer, released before it is.
    std::vector<std::pair<CommHandle, CommWindow>> windows;
    void* shmem = nullptr;  // NVSHMEM: this PE's buffer, the symmetric address of every PE's
  };

  // One collective round, tagged with its op and sequence number: every
  // process's payload once all are at this op and none failed. A process
  // whose `local` status failed still takes part, sending its reason; then
  // every process gets an error naming the first that failed. Members out
  // of step, or an exchange that failed, break the heap: every later
  // collective fails at once, naming why. Received FDs are the caller's only
  // for kHandles on success; otherwise they are closed here.
  enum class Op : std::uint8_t {
    kSize = 1,
    kCandidates,
    kHandles,
    kCommit,
    kEmptyCache,
    kShmemState,  // NVSHMEM, at Create: each process's NVSHMEM state
    kShmemId,     // process 0's unique id
    kShmemInit,   // every process initialised NVSHMEM
    kShmemReady,  // a miss: every member ready to enter nvshmem_malloc
    kWindow,
    kWindowCommit,
    kReleaseWindows,
    kCreate,  // every process's verdict on its arguments, and the options the group must share
  };
  absl::StatusOr<std::vector<Contribution>> Round(Op op, const absl::Status& local,
                                                  Contribution mine)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Agreed {
    std::size_t bytes = 0;
    std::size_t stride = 0;  // for `bytes` at the group's granularity (overflow-checked)
    std::vector<std::uint64_t> candidates;  // each process's, for the agreed stride
  };
  // After a build's last round, whose contributions begin with ShapeBytes:
  // kInvalidArgument unless every process built this `bytes` and `stride`
  // (every member checks what the group agreed against what it mapped).
  absl::Status CheckSameShape(const std::vector<Contribution>& all, std::size_t bytes,
                              std::size_t stride) const;
  static std::string ShapeBytes(std::size_t bytes, std::size_t stride);

  absl::StatusOr<std::unique_ptr<Entry>> Build(std::size_t bytes, std::size_t stride)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The providers' halves (symmetric_vmm.cc, symmetric_nvshmem.cc).
  absl::StatusOr<std::unique_ptr<Entry>> BuildVmm(std::size_t bytes, std::size_t stride)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::unique_ptr<Entry>> BuildShmem(std::size_t bytes, std::size_t stride)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool DestroyVmm(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Member r's buffer as mapped here (null: unreachable), appended to a's
  // peers, signals (the stride's last signal_bytes) and device table;
  // a.stride is set.
  void AddPeer(SymmetricAllocation& a, int r, void* buffer) const;
  // a.device_peers: a table of one pointer per member, in managed memory
  // of this process's first device (the caller frees it on failure).
  absl::Status AllocatePeerTable(SymmetricAllocation& a) const;
  // NVSHMEM at Create: agrees on NVSHMEM's state and initialises it
  // together (`local`: this process's own checks, joined to the first round).
  absl::Status StartShmem(const absl::Status& local) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // NVSHMEM's EmptyCache: the entries cached on every member, freed together.
  absl::Status EmptyShmemCache() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live entry behind `handle`, or why not (`who` names the call).
  absl::StatusOr<Entry*> LiveEntry(const SymmetricHandle& handle, const char* who)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Transfer(bool put, const SymmetricHandle& handle, int rank, std::size_t offset,
                        void* local, std::size_t bytes, Stream stream);
  // What statistics and snapshots see: each called under mu_ once an
  // operation is over, updates them in one step under stats_mu_.
  void PublishHit(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishMiss(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishFree(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishEmptied(const Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Agreed> AgreeOnSize(std::size_t bytes, bool make_symmetric)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The cached allocation Allocate would reuse for `stride` (the oldest, by
  // collective id), or 0.
  std::uint64_t Candidate(std::size_t stride) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Agrees with every member on one cached allocation of `stride` by its id:
  // `mine` is this process's candidate, `theirs` what every process sent.
  static bool AllName(std::uint64_t mine, const std::vector<std::uint64_t>& theirs);
  SymmetricHandle FromCache(std::size_t bytes, std::size_t stride, std::uint64_t id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deregisters `e`'s windows (on every communicator, or on `comm` only);
  // returns how many went. One whose deregistration fails is forgotten all
  // the same: the library keeps what it holds until its communicator goes.
  int DropWindows(Entry& e, CommHandle comm = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `e` live under a fresh generation.
  SymmetricHandle HandOut(std::unique_ptr<Entry> e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Idempotent: each step clears what it released; false if anything is
  // left (the entry is then kept and retried when the heap is destroyed).
  bool Destroy(Entry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The stride of a request of `bytes` at `granularity` (a power of two):
  // the size rounded to 256, plus signal_bytes, rounded to the granularity.
  // kInvalidArgument, naming the request, when any step or the reservation
  // of world_size strides overflows size_t (symmetric_agree.cc).
  absl::StatusOr<std::size_t> StrideFor(std::size_t bytes, std::size_t granularity) const;
  // options_.non_dumpable: taken before memory is mapped, given back once
  // no entry is left (at the end of every collective and at teardown).
  absl::Status HoldNonDumpable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseNonDumpableIfEmpty() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool MulticastAllowed() const;

  Backend& backend_;
  const SymmetricGroup group_;
  const std::unique_ptr<Exchange> exchange_;
  const SymmetricOptions options_;
  const std::size_t granularity_;  // this process's (the group's maximum is agreed on a miss)
  const HandleType handle_type_;
  const std::string handle_fallback_reason_;
  const std::uint64_t id_;  // this heap's identity in its handles
  // Across hosts with fabric handles: this process's NVLink domain (its
  // devices' DeviceFacts::fabric_domain); set once by Create.
  std::string fabric_domain_;
  // Whether any member asked for non_dumpable (AgreeOnCreate): then every
  // member holds it, as its mappings expose the others' memory. Set once by
  // Create, before the heap is shared.
  bool group_non_dumpable_ = false;

  absl::Mutex mu_;
  std::uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::uint64_t next_generation_ ABSL_GUARDED_BY(mu_) = 1;
  // Keyed by the address handed out, so that Free can check a pointer
  // before it reads anything through it.
  std::map<const SymmetricAllocation*, std::unique_ptr<Entry>> live_ ABSL_GUARDED_BY(mu_);
  // Keyed by (stride, collective id): the oldest of a stride comes first,
  // whatever order the frees came in.
  std::map<std::pair<std::size_t, std::uint64_t>, std::unique_ptr<Entry>> cache_
      ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Entry>> leftovers_ ABSL_GUARDED_BY(mu_);
  bool non_dumpable_held_ ABSL_GUARDED_BY(mu_) = false;
  std::uint64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;  // collective rounds so far
  absl::Status broken_ ABSL_GUARDED_BY(mu_);       // why the group is out of step, if it is
  std::size_t group_granularity_ ABSL_GUARDED_BY(mu_) = 0;  // 0 until the first exchange
  // The last miss's step times, as Build measures them (published at the
  // end of the Allocate).
  std::map<std::string, double> miss_seconds_ ABSL_GUARDED_BY(mu_);

  // mu_ is held across collectives, so readers of statistics use their own
  // lock, taken (after mu_) only for the few assignments of a Publish*.
  absl::Mutex stats_mu_ ABSL_ACQUIRED_AFTER(mu_);
  SymmetricStats stats_ ABSL_GUARDED_BY(stats_mu_);
  std::map<std::uint64_t, SymmetricSnapshot> views_ ABSL_GUARDED_BY(stats_mu_);  // by id
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_SYMMETRIC_SYMMETRIC_HEAP_H_
