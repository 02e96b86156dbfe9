// HostBackend: the whole Backend interface emulated on the CPU, so that every
// allocator and policy test runs without a GPU.
//
//  * Managed memory is anonymous mmap; each numbered device has its own
//    capacity (HostBackendOptions), so out-of-memory is testable.
//  * Streams are ordered queues of abstract work. By default work completes
//    the moment it is enqueued; with `manual_completion` it stays pending until
//    the test calls CompleteWork, which simulates "a kernel still uses this
//    block". Events capture a stream's position and complete when the stream
//    passes it; SynchronizeEvent/SynchronizeStream complete the work they wait
//    for, as a real device eventually would.
//  * VMM physical memory is a memfd; a reserved range is PROT_NONE until
//    mapped and given access, and an exported handle is a dup'ed FD that can
//    cross processes with SCM_RIGHTS.
//  * Every advise/prefetch/discard call is recorded (Records()) so that tests
//    can assert exactly what the policies asked for.
//
// Thread safety: all methods are safe to call concurrently.
#ifndef CMA_BACKENDS_HOST_HOST_BACKEND_H_
#define CMA_BACKENDS_HOST_HOST_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"

namespace cma {

struct HostBackendOptions {
  int device_count = 2;
  std::size_t device_capacity = std::size_t{8} << 30;  // per device
  bool manual_completion = false;
  std::size_t vmm_granularity = std::size_t{2} << 20;
  bool multicast_supported = false;
  bool fabric_handles = false;
  // Pinned host memory (AllocatePinnedHost) this process may hold, like the
  // page-locked limit of a real host: past it the call fails.
  std::size_t pinned_capacity = std::size_t{64} << 30;
  // Pinned buffers one right after another in the address space (carved
  // from one reservation of pinned_capacity bytes), as a real host's mmap
  // sometimes places them: a copy that runs across two is still refused.
  bool pinned_back_to_back = false;
  // Reported in DeviceFacts only: false stands for a GPU whose managed
  // memory does not migrate on fault (ROCm without XNACK), so that the
  // allocator's refusals can be tested; the emulation itself is unchanged.
  bool page_fault_migration = true;
  // GetHostMemInfo's answer (available, total); 0: the real host's.
  std::size_t host_available = 0;
  std::size_t host_total = 0;
  // Several hosts emulated in one machine (issue 33; docs/symmetric.md).
  // `host_id`: the emulated host this backend is on. Its VMM memory is a
  // memfd named after it ("cma-vmm@<host_id>"; plain "cma-vmm" when empty,
  // as before), and VmmImport refuses (kPermissionDenied) a POSIX FD exported
  // on another emulated host, as SCM_RIGHTS cannot cross real hosts.
  // `fabric_domain`: the emulated NVLink domain. With fabric_handles and a
  // domain, VmmCreate(kFabric) makes a POSIX shared-memory object under a
  // random name (mode 0600, "/cma-fabric-<domain>-<host>-<32 hex digits>"),
  // VmmExport(kFabric) hands out that name as the 64 fabric bytes and
  // VmmImport opens it only in the same domain (kPermissionDenied otherwise);
  // the creator unlinks the name at VmmRelease. Without a domain, fabric
  // export fails (kUnimplemented) as before: a device that claims fabric
  // support without an IMEX channel. Each is 1 to 16 of [A-Za-z0-9_.]; any
  // other value makes every VMM call fail (kInvalidArgument naming it).
  // Left empty, each is read from the environment when the backend is
  // made: CMA_HOST_EMULATED_HOST, CMA_HOST_FABRIC_DOMAIN.
  std::string host_id;
  std::string fabric_domain;
  // The NVSHMEM emulation (the Shmem* calls; host_shmem.cc). The PEs of one
  // unique id share a POSIX shared-memory object ("/cma-shmem-<32 hex
  // digits>", mode 0600, unlinked as soon as every PE has opened it): a
  // header where each PE posts its collective calls, then one heap of
  // `shmem_heap_bytes` per PE (sparse: pages cost nothing until touched).
  // ShmemInit, ShmemMalloc and ShmemFree wait, as NVSHMEM's do, until every
  // PE has made the same call; a PE that never comes makes the others fail
  // after `shmem_timeout_seconds` (kDeadlineExceeded, "NVSHMEM would wait
  // here forever") and a PE that made another call (another size, another
  // allocation: undefined behaviour in NVSHMEM) makes every PE fail naming
  // both; either leaves the emulated NVSHMEM broken (every later call fails).
  // Allocations are placed by the same first-fit on every PE, and checked
  // to land at the same offset. With `shmem_unreachable` (or the
  // environment's CMA_HOST_SHMEM_UNREACHABLE=1 when the backend is made),
  // other PEs' heaps are not mapped here: ShmemPeerPointer returns null for
  // them and ShmemPut/ShmemGet reach them through the object's descriptor
  // (pwrite/pread), as NVSHMEM's put/get reach a PE over the network.
  std::size_t shmem_heap_bytes = std::size_t{256} << 20;  // a multiple of 64 KiB
  bool shmem_unreachable = false;
  double shmem_timeout_seconds = 10;
  // QueryStream and QueryEvent answer "not yet" for work that has all
  // completed this often (percent, 0-100; a fixed pseudo-random sequence),
  // as a GPU's compute and communication streams, asked at a random moment,
  // are often mid-kernel (FSDP2's, issue 49). Waits and synchronisation are
  // unchanged: only what a query sees.
  int busy_query_percent = 0;
};

// One recorded placement call.
struct PlacementRecord {
  enum class Op { kAdvise, kPrefetch, kDiscard, kDiscardAndPrefetch, kCopy };
  Op op;
  void* ptr;
  std::size_t bytes;
  Advice advice;       // kAdvise only
  Location location;   // target (advise/prefetch); unused for kDiscard
  Stream stream;
  bool batched;        // came through a *Batch call
  // The stream's position when the call was made: the call runs once the
  // stream has completed this much work (a discard queued behind a kernel).
  std::int64_t ticket = 0;
  std::uint64_t seq = 0;  // order among records and waits
  const void* src = nullptr;  // kCopy: the source (`ptr` is the destination)
};

// One StreamWaitEvent call: `stream`'s later work waits until `on` has
// completed `ticket` units (the event's captured position).
struct StreamWaitRecord {
  Stream stream;
  Stream on;
  std::int64_t ticket;
  std::uint64_t seq;  // order among records and waits
};

// Where one 2 MiB page of reserved managed memory is (PageLocation).
inline constexpr int kPageUnpopulated = -1;
inline constexpr int kPageOnHost = -2;

// Live resources, for leak checks at teardown.
struct HostResourceCounts {
  int managed_allocations = 0;
  std::size_t managed_bytes = 0;
  int streams = 0;
  int events = 0;
  int physical_handles = 0;
  int reservations = 0;
  int mappings = 0;
  int multicast_objects = 0;
  int pinned_allocations = 0;
  std::size_t pinned_bytes = 0;
  int comm_windows = 0;
  int shmem_allocations = 0;  // live ShmemMalloc allocations of this PE
  friend bool operator==(const HostResourceCounts& a, const HostResourceCounts& b) {
    return a.pinned_allocations == b.pinned_allocations && a.pinned_bytes == b.pinned_bytes &&
           a.comm_windows == b.comm_windows && a.shmem_allocations == b.shmem_allocations &&
           a.managed_allocations == b.managed_allocations &&
           a.managed_bytes == b.managed_bytes && a.streams == b.streams &&
           a.events == b.events && a.physical_handles == b.physical_handles &&
           a.reservations == b.reservations && a.mappings == b.mappings &&
           a.multicast_objects == b.multicast_objects;
  }
};

class HostBackend final : public Backend {
 public:
  explicit HostBackend(HostBackendOptions options = {});
  ~HostBackend() override;
  HostBackend(const HostBackend&) = delete;
  HostBackend& operator=(const HostBackend&) = delete;

  const char* name() const override { return "host"; }

  absl::StatusOr<int> DeviceCount() override;
  absl::StatusOr<DeviceFacts> GetDeviceFacts(int device) override;
  absl::StatusOr<MemInfo> GetMemInfo(int device) override;
  absl::StatusOr<MemInfo> GetHostMemInfo() override;

  absl::StatusOr<void*> AllocateManaged(int device, std::size_t bytes) override;
  absl::Status FreeManaged(void* ptr) override;
  // Charges nothing until pages are placed on a device: a prefetch (or
  // discard-and-prefetch) to device d populates the 2 MiB pages it touches
  // there (past d's capacity it oversubscribes, as a GPU would, rather than
  // fail); a prefetch to the host or a discard gives wholly covered pages
  // back. GetMemInfo counts them.
  absl::StatusOr<void*> ReserveManaged(int device, std::size_t bytes) override;

  absl::Status Advise(void* ptr, std::size_t bytes, Advice advice, Location location) override;
  absl::Status Prefetch(void* ptr, std::size_t bytes, Location location, Stream stream) override;
  absl::Status PrefetchBatch(absl::Span<const Range> ranges, Location location,
                             Stream stream) override;
  absl::Status DiscardBatch(absl::Span<const Range> ranges, Stream stream) override;
  absl::Status DiscardAndPrefetchBatch(absl::Span<const Range> ranges, Location location,
                                       Stream stream) override;
  absl::StatusOr<RangeAttributes> GetRangeAttributes(void* ptr, std::size_t bytes) override;

  // Pinned host memory is anonymous mmap counted against
  // options.pinned_capacity. A copy runs at once (like every placement
  // here) and is recorded (Op::kCopy, with its stream's ticket): each side
  // must lie wholly inside one managed allocation or one pinned buffer; a
  // copy into unpopulated managed pages populates them on the stream's
  // device (the allocation's for the default stream), as a GPU's would.
  absl::StatusOr<void*> AllocatePinnedHost(std::size_t bytes) override;
  absl::Status FreePinnedHost(void* ptr) override;
  absl::Status CopyBatch(absl::Span<const Copy> copies, Stream stream) override;

  absl::StatusOr<Stream> CreateStream(int device) override;
  absl::Status DestroyStream(Stream stream) override;
  absl::Status ValidateStream(int device, Stream stream) override;
  absl::Status SynchronizeStream(Stream stream) override;
  absl::StatusOr<bool> QueryStream(Stream stream) override;
  // Runs `fn` when the stream's work before it completes: at once in
  // immediate mode, else when CompleteWork (or a wait's resolution) gets
  // there, on the calling thread, under the backend's lock (so `fn` must not
  // call the backend, as the contract says). Counts as one unit of work.
  absl::Status LaunchHostFunction(Stream stream, absl::AnyInvocable<void() &&> fn) override;
  // As CUDA's cudaStreamIsCapturing; a test marks a stream (SetCapturing).
  absl::StatusOr<bool> IsCapturing(Stream stream) override;
  // The capture graph the test built (SetCapturing, AddCaptureNode, JoinCapture).
  absl::StatusOr<std::optional<CaptureFrontier>> CaptureFrontierOf(Stream stream) override;
  absl::StatusOr<std::vector<CaptureNode>> CaptureNodeDependencies(CaptureNode node) override;
  absl::StatusOr<Event> CreateEvent(int device) override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::StatusOr<bool> QueryEvent(Event event) override;
  absl::Status SynchronizeEvent(Event event) override;
  absl::Status StreamWaitEvent(Stream stream, Event event) override;

  absl::StatusOr<std::size_t> VmmGranularity(int device) override;
  absl::StatusOr<PhysicalHandle> VmmCreate(int device, std::size_t bytes,
                                           HandleType exportable) override;
  absl::Status VmmRelease(PhysicalHandle handle) override;
  absl::StatusOr<void*> VmmReserve(std::size_t bytes, std::size_t alignment) override;
  absl::Status VmmFreeAddress(void* address, std::size_t bytes) override;
  absl::Status VmmMap(void* address, std::size_t bytes, PhysicalHandle handle) override;
  absl::Status VmmUnmap(void* address, std::size_t bytes) override;
  absl::Status VmmSetAccess(void* address, std::size_t bytes,
                            absl::Span<const int> devices) override;
  absl::StatusOr<ShareableHandle> VmmExport(PhysicalHandle handle, HandleType type) override;
  // Accepts only what VmmExport sends: a memfd made by a host backend's
  // VmmCreate (named "cma-vmm", its size sealed against shrinking and
  // growing) of `shared.bytes` bytes when that is set; anything else (a
  // regular file, a pipe, another program's memfd, one whose size is not
  // sealed) is kInvalidArgument saying what it is. A memfd of another
  // emulated host, or a fabric handle of another emulated domain, is
  // kPermissionDenied (HostBackendOptions::host_id, fabric_domain). A fabric
  // object (by name, or as a POSIX FD within its host) must be this user's,
  // mode 0600, of the announced size.
  absl::StatusOr<PhysicalHandle> VmmImport(const ShareableHandle& shared) override;

  absl::StatusOr<MulticastHandle> MulticastCreate(absl::Span<const int> devices,
                                                  std::size_t bytes) override;
  absl::Status MulticastAddDevice(MulticastHandle mc, int device) override;
  absl::Status MulticastBindMemory(MulticastHandle mc, std::size_t mc_offset,
                                   PhysicalHandle mem, std::size_t mem_offset,
                                   std::size_t bytes) override;
  absl::Status MulticastRelease(MulticastHandle mc) override;

  // Communicators are emulated (MakeEmulatedComm): registration checks
  // what NCCL's does (the range inside one mapping of this backend, its
  // offset there aligned to 4096) and records the window; no exchange is
  // made, so agreement among members is the caller's to test.
  absl::StatusOr<CommFacts> GetCommFacts(CommHandle comm) override;
  absl::StatusOr<CommWindow> RegisterCommWindow(CommHandle comm, void* ptr,
                                                std::size_t bytes) override;
  absl::Status DeregisterCommWindow(CommHandle comm, CommWindow window) override;
  // One side inside one VMM mapping, managed allocation, pinned buffer or
  // the emulated NVSHMEM heap as mapped here, the other any memory of this
  // process (kInvalidArgument when neither); runs at once, like every copy
  // here.
  absl::Status PeerCopy(void* dst, const void* src, std::size_t bytes, Stream stream) override;
  // NVSHMEM emulated across processes: HostBackendOptions::shmem_*.
  absl::StatusOr<ShmemState> ShmemQueryState() override;
  absl::StatusOr<std::string> ShmemUniqueId() override;
  absl::Status ShmemInit(const std::string& unique_id, int pe, int n_pes, int device) override;
  absl::StatusOr<void*> ShmemMalloc(std::size_t bytes) override;
  absl::Status ShmemFree(void* ptr) override;
  absl::StatusOr<void*> ShmemPeerPointer(void* ptr, int pe) override;
  absl::Status ShmemPut(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override;
  absl::Status ShmemGet(void* dst, const void* src, std::size_t bytes, int pe,
                        Stream stream) override;
  absl::Status ShmemQuiet(Stream stream) override;

  // ---- test controls ----
  // A communicator as NCCL's would be for member `rank` of `size` on
  // `device`. Without `windows_supported`, registration succeeds with no
  // window, as NCCL's does where symmetric windows are unsupported.
  CommHandle MakeEmulatedComm(int rank, int size, int device, bool windows_supported = true);
  // As ncclCommDestroy: the communicator's windows go with it.
  void DestroyEmulatedComm(CommHandle comm);
  // Enqueues one unit of pending work on `stream` (a "kernel"). In immediate
  // mode it completes at once.
  absl::Status EnqueueWork(Stream stream);
  // Completes all work enqueued so far on `stream`.
  absl::Status CompleteWork(Stream stream);
  // Number of enqueued-but-incomplete work units on `stream`.
  std::int64_t PendingWork(Stream stream);
  // Placement calls and stream waits since the last ClearRecords. A discard
  // really throws the contents of the wholly covered pages away (they read
  // as zeros afterwards), as a GPU's does.
  std::vector<PlacementRecord> Records() const;
  std::vector<StreamWaitRecord> Waits() const;
  void ClearRecords();
  // Work units enqueued on / completed by `stream` so far.
  std::pair<std::int64_t, std::int64_t> StreamPosition(Stream stream);
  // A device number, kPageOnHost or kPageUnpopulated for the 2 MiB page
  // holding `ptr` of a ReserveManaged range; kPageUnpopulated elsewhere.
  int PageLocation(const void* ptr) const;
  // Whether `ptr` lies in a ReserveManaged range (whose pages are tracked;
  // an AllocateManaged range counts as populated whole).
  bool InReservedRange(const void* ptr) const;
  // Bytes `device`'s managed memory holds populated on the device or moved
  // to the host: what a caching allocator's reserved bytes should count.
  std::size_t PopulatedBytes(int device) const;
  HostResourceCounts LiveResources() const;
  // Calls of one method name so far ("AllocateManaged", "RecordEvent", ...).
  std::int64_t CallCount(const std::string& method) const;
  std::int64_t TotalCalls() const;
  // A kernel on `device` touching [ptr, ptr + bytes) of managed memory: as
  // on a GPU, unpopulated pages (and pages on the host) are populated there
  // on first touch. Not recorded: it is the user's access, not a call.
  void Touch(const void* ptr, std::size_t bytes, int device);
  // Marks `stream` as capturing a CUDA graph (IsCapturing reports it): with
  // `capturing`, a new capture sequence with an empty graph starts there.
  void SetCapturing(Stream stream, bool capturing);
  // A graph node captured on `stream` (a kernel, a copy): it depends on the
  // stream's frontier, and becomes it. 0 when the stream is not capturing.
  CaptureNode AddCaptureNode(Stream stream);
  // `waiter` waits for `waited` inside a capture (an event recorded on
  // `waited` and waited on by `waiter`, as torch's wait_stream): `waiter`
  // joins `waited`'s capture, and its frontier gains `waited`'s.
  void JoinCapture(Stream waiter, Stream waited);
  // Changes a device's capacity (e.g. to create memory pressure mid-test).
  void SetDeviceCapacity(int device, std::size_t bytes);

 private:
  struct StreamState {
    int device;  // -1 for the default stream (valid everywhere)
    std::int64_t submitted = 0;
    std::int64_t completed = 0;
    // Units of work that are waits (StreamWaitEvent) on another stream's
    // position: unit number -> (stream, ticket). A wait completes by itself
    // once that stream gets there; later units cannot complete before it.
    std::map<std::int64_t, std::pair<Stream, std::int64_t>> waits;
    // Host functions by the unit of work they are (LaunchHostFunction).
    std::map<std::int64_t, absl::AnyInvocable<void() &&>> host_functions;
    bool capturing = false;
    std::uint64_t capture = 0;                 // while capturing: its sequence
    std::vector<CaptureNode> capture_frontier;  // see CaptureFrontier
  };
  struct EventState {
    int device;
    Stream stream = 0;
    std::int64_t ticket = 0;  // stream position captured at record time
    bool recorded = false;
  };
  struct ManagedAllocation {
    int device;
    std::size_t bytes;
    RangeAttributes attributes;
    // ReserveManaged only: per 2 MiB page, the device it is populated on,
    // kPageOnHost or kPageUnpopulated.
    bool reserved = false;
    std::vector<int> page_device;
  };
  // Populates or gives back the pages of a reserved allocation.
  void PopulatePages(ManagedAllocation& a, std::uintptr_t base, const Range& r,
                             PlacementRecord::Op op, Location location)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct PhysicalMemory {
    int fd;  // -1 once released
    std::size_t bytes;
    int device;
    int maps = 0;  // as with CUDA, mappings keep released memory alive
    std::string shm_name;  // a fabric object this backend created: unlinked at release
  };
  // HostBackendOptions::host_id and fabric_domain as they must be.
  absl::Status CheckEmulatedIds() const;
  struct Mapping {
    std::size_t bytes;
    PhysicalHandle handle;
  };

  void Count(const char* method) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckDevice(int device) const;
  absl::StatusOr<StreamState*> FindStream(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The ReserveManaged range holding p (its start in *base), or nullptr.
  const ManagedAllocation* ReservedAt(std::uintptr_t p, std::uintptr_t* base) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ManagedAllocation*> FindManaged(void* ptr, std::size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRanges(absl::Span<const Range> ranges, const char* call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(PlacementRecord record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks, applies and records one placement call over `ranges`.
  absl::Status Place(PlacementRecord::Op op, absl::Span<const Range> ranges, Location location,
                     Stream stream, bool batched, const char* call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CompleteLocked(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes `stream`'s work up to unit `ticket`, and what its waits there
  // wait for, as a device that ran it would have.
  void CompleteUpTo(Stream stream, std::int64_t ticket, int depth = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes the leading waits whose streams have got where they wait for.
  void Settle(StreamState& s, int depth = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `stream` settled, or nullptr once it is destroyed.
  StreamState* Settled(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Advance(StreamState& s) const;  // immediate mode completes at once
  // Runs (and forgets) the host functions `s` has completed.
  static void RunCompletedHostFunctions(StreamState& s);
  void DropPhysical(absl::flat_hash_map<PhysicalHandle, PhysicalMemory>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The emulated NVSHMEM of this process (host_shmem.cc), under its own
  // lock, taken before mu_: its collectives wait for the other PEs.
  struct Shmem;
  struct ShmemDeleter {
    void operator()(Shmem* s) const;
  };
  // Whether [p, p + bytes) lies inside memory a copy may touch here.
  bool InCopyable(const void* p, std::size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(shmem_mu_, mu_);
  absl::Status ShmemCheckStream(Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  int ShmemLiveAllocations() const ABSL_LOCKS_EXCLUDED(shmem_mu_);
  absl::Status ShmemTransfer(bool put, void* dst, const void* src, std::size_t bytes, int pe,
                             Stream stream);

  const HostBackendOptions options_;
  mutable absl::Mutex shmem_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<Shmem, ShmemDeleter> shmem_ ABSL_GUARDED_BY(shmem_mu_);
  mutable absl::Mutex mu_;
  std::vector<std::size_t> capacity_ ABSL_GUARDED_BY(mu_);
  std::vector<std::size_t> used_ ABSL_GUARDED_BY(mu_);  // AllocateManaged + populated pages
  std::map<std::uintptr_t, ManagedAllocation> managed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Stream, StreamState> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Event, EventState> events_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<PhysicalHandle, PhysicalMemory> physical_ ABSL_GUARDED_BY(mu_);
  std::map<std::uintptr_t, std::size_t> reservations_ ABSL_GUARDED_BY(mu_);
  std::map<std::uintptr_t, std::size_t> pinned_ ABSL_GUARDED_BY(mu_);  // base -> bytes
  std::size_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  char* pinned_region_ ABSL_GUARDED_BY(mu_) = nullptr;  // pinned_back_to_back's reservation
  std::size_t pinned_region_used_ ABSL_GUARDED_BY(mu_) = 0;
  // Whether [p, p + bytes) lies wholly inside one pinned buffer.
  bool InPinned(const void* p, std::size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<std::uintptr_t, Mapping> mappings_ ABSL_GUARDED_BY(mu_);
  struct EmulatedComm {
    CommFacts facts;
    bool windows_supported = true;
    absl::flat_hash_map<CommWindow, std::pair<std::uintptr_t, std::size_t>> windows;
  };
  absl::flat_hash_map<CommHandle, EmulatedComm> comms_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<MulticastHandle, std::vector<int>> multicast_ ABSL_GUARDED_BY(mu_);
  std::vector<PlacementRecord> records_ ABSL_GUARDED_BY(mu_);
  std::vector<StreamWaitRecord> waits_ ABSL_GUARDED_BY(mu_);
  std::uint64_t record_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::int64_t> calls_ ABSL_GUARDED_BY(mu_);
  std::uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::uint64_t busy_draws_ ABSL_GUARDED_BY(mu_) = 0;  // busy_query_percent's sequence
  bool AnswerBusy() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // busy_query_percent's next draw
  // Every node AddCaptureNode made, with the nodes it depends on.
  absl::flat_hash_map<CaptureNode, std::vector<CaptureNode>> capture_nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cma

#endif  // CMA_BACKENDS_HOST_HOST_BACKEND_H_
