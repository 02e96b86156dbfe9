// HostPool: the caching allocator's pool for CPU-side memory (PyTorch's CPU
// tensors under cma.torch's managed switch, cma_malloc with location -1).
// Its memory is managed memory that the host populates, so the CPU uses it as
// ordinary memory, and a GPU reaches the same bytes after a Move migrates
// them there, without a copy (PyTorch RFC-0023's tensor.to()).
//
// Sizes follow policy/host_size_class.h: small requests share 2 MiB slabs,
// larger ones get whole pages of their own.
//
// Reuse: a block no GPU has used is reusable as soon as it is freed (the CPU
// is its only user). A block a GPU used (a Move, or RecordStream) waits, once
// freed, until the work queued at the free on every stream that used it has
// completed. If its pages were left on a device, the free first sends them
// back to the host in the order of the last move's stream, contents
// discarded, so that the next CPU user writes host pages instead of faulting
// them back one by one.
//
// Placement: a Move to a device migrates the pages there, unless the
// allocation's hints (SetHints) prefer the host: then the pages stay on the
// host and the device maps them (accessed-by), reading and writing them over
// the link. That wins when the GPU touches the bytes about once (a batch, a
// CPU/GPU round trip: measured in bench/results/h200_managed_cpu), since
// migrating back to the host must repopulate its pages.
//
// Thread safety: every method may be called concurrently (one lock).
// Ownership: the backend outlives the pool; the destructor releases every
// segment, also those still handed out. Errors: size 0, or a size beyond the
// host's memory, is kInvalidArgument; a pointer this pool did not hand out is
// NotMine() (kNotFound with an empty message, so the caller may ask a
// device); a double free is kInvalidArgument. A failing call changes nothing.
#ifndef CMA_ALLOCATOR_HOST_POOL_H_
#define CMA_ALLOCATOR_HOST_POOL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "allocator/host_ledger.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"
#include "backends/backend.h"
#include "policy/host_size_class.h"
#include "policy/placement_policy.h"

namespace cma {

struct HostPoolStats {
  Stat allocation;       // blocks handed out
  Stat segment;          // slabs and segments held (backend allocations)
  Stat allocated_bytes;  // rounded sizes handed out
  Stat requested_bytes;  // sizes asked for
  Stat reserved_bytes;   // slabs and segments held
  // Bytes of live blocks whose pages were last moved to a device.
  Stat device_resident_bytes;
  std::int64_t pending_frees = 0;  // freed blocks waiting for a GPU's work
  std::int64_t moves = 0;
  std::int64_t moved_bytes_to_device = 0;
  std::int64_t moved_bytes_to_host = 0;
  // Moves to a device of allocations whose hints prefer the host: mapped
  // there, nothing migrated.
  std::int64_t mapped_moves = 0;
  std::int64_t mapped_bytes = 0;
  std::int64_t advise_calls = 0;
  // Pages a free sent back to the host (contents discarded).
  std::int64_t returned_bytes = 0;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_streams = 0;  // frees that had to wait for a stream
  std::int64_t num_placement_errors = 0;
  std::int64_t budget_bytes = 0;

  // "allocated_bytes.current", "moves", ...
  std::map<std::string, std::int64_t> Flatten() const;
};

class HostPool {
 public:
  // `backend` must outlive the pool. `device_count` bounds Move's targets;
  // `budget` caps the bytes of slabs and segments held (the host's memory).
  // `quiet` (may be empty) says whether a private pool context is open on
  // some device (a CUDA graph capture may be under way): the pool then
  // makes no stream, event or placement call. A free that needs one waits
  // until the context ends; Move and SetHints are refused meanwhile. It is
  // called under the pool's lock and must not call the pool. `ledger` (may
  // be null; must outlive the pool) is shared with the devices' host tiers:
  // what the pool holds is taken from it too.
  HostPool(Backend* backend, int device_count, std::size_t budget,
           std::function<bool()> quiet = {}, HostLedger* ledger = nullptr);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  absl::StatusOr<void*> Allocate(std::size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // kUnavailable, the block still allocated, when its reuse cannot be
  // ordered after a stream that used it (no event, and the stream cannot be
  // waited for).
  absl::Status Free(void* ptr) ABSL_LOCKS_EXCLUDED(mu_);
  // `stream` (of `device`; -1: the device it last moved to, else 0) uses the
  // allocation: a free waits for its work.
  absl::Status RecordStream(void* ptr, Stream stream, int device) ABSL_LOCKS_EXCLUDED(mu_);
  // Migrates the allocations' pages to `target` in `stream`'s order (a
  // device's stream; for the host, the stream the GPU last used them on).
  // All pointers are checked before anything moves: NotMine() if one is not
  // a live allocation of this pool. `target` is a valid location (the
  // caller, CachingManagedAllocator::MoveBatch, checks it).
  absl::Status Move(absl::Span<void* const> ptrs, Location target, Stream stream,
                    bool contents_dead) ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the allocation's advice. Refused
  // (kFailedPrecondition) for a chunk of a shared slab (1 MiB or less):
  // advice covers whole pages, its neighbours' too.
  absl::Status SetHints(void* ptr, const AllocationHints& hints) ABSL_LOCKS_EXCLUDED(mu_);
  // The bytes requested for the live allocation at `ptr`.
  absl::StatusOr<std::size_t> RequestedSize(void* ptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Where the live allocation at `ptr` was last moved (the host if never).
  absl::StatusOr<Location> LocationOf(void* ptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits for `stream`'s work; the pool never uses the stream again (call
  // before destroying it).
  absl::Status ForgetStream(Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Releases every idle segment and every slab none of whose chunks is in
  // use. Frees still waiting for a GPU keep theirs.
  absl::Status EmptyCache() ABSL_LOCKS_EXCLUDED(mu_);
  HostPoolStats GetStats() ABSL_LOCKS_EXCLUDED(mu_);
  // The live allocations (freed ones awaiting a GPU's work included, as
  // "active_pending_free"), by address; location: where the last move left
  // the pages ("host" or "device N").
  std::vector<BlockSnapshot> Snapshot() ABSL_LOCKS_EXCLUDED(mu_);
  void ResetPeakStats() ABSL_LOCKS_EXCLUDED(mu_);
  // Free lists hold exactly the free blocks, slabs count their chunks in
  // use, and the statistics equal a recount.
  absl::Status CheckInvariants() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;  // rounded
    std::size_t requested = 0;
    int chunk_class = -1;       // -1: a segment of its own
    std::uintptr_t slab = 0;    // the slab a chunk was carved from
    bool allocated = false;
    bool pending = false;       // freed, waiting for a GPU's work
    Location location = Location::Host();
    Stream last_stream = kDefaultStream;  // the last move's
    int last_device = 0;                  // the last device it moved to
    absl::InlinedVector<std::pair<Stream, int>, 2> uses;  // GPU streams, devices
    std::unique_ptr<AllocationHints> hints;  // the owner's advice (SetHints)
    // The advice in force on the memory: the owner's, plus the devices a
    // mapped move added. It outlives the owner: a later owner asking for the
    // same (a DataLoader's next batch) costs no driver call, and one that
    // asks for other advice, or moves the block without any, replaces it.
    std::unique_ptr<AllocationHints> applied;
  };
  struct ByAddr {
    bool operator()(const Block* a, const Block* b) const { return a->addr < b->addr; }
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->addr < b->addr;
    }
  };
  struct Slab {
    int chunk_class = 0;
    int in_use = 0;           // chunks allocated or pending
    std::size_t carved = 0;   // chunks made so far, from the slab's start
  };
  // A freed block not yet reusable: until `events` fire and `stream` (if
  // set) is idle; `deferred`: its free came during a pool context, and the
  // ordering work (OrderReuse) is still to be done.
  struct Pending {
    Block* block;
    std::vector<Event> events;
    std::optional<Stream> stream;
    bool deferred = false;
  };

  static bool PrefersHost(const Block& b) {
    return b.hints && b.hints->preferred_location && b.hints->preferred_location->is_host();
  }
  Block* Find(void* ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* TakeCached(std::size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Block*> Carve(std::size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Block* NewChunk(std::uintptr_t slab, int cls, std::size_t index)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void* HandOut(Block* b, std::size_t requested) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MakeFree(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddUse(Block* b, Stream stream, int device) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Quiet() const { return quiet_ && quiet_(); }
  // Orders the reuse of `b` after every GPU use, sending its pages home
  // first (ordered after every use) if a move left them on a device. On
  // success, `p` says when it is reusable; on failure nothing that changes
  // `b` was queued.
  absl::Status OrderReuse(Block* b, Pending* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The owner lets go of `b` (statistics, advice of the owner).
  void Release(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes pending frees whose events have fired (all of them, waiting,
  // when `wait`), doing deferred ones' ordering first. Nothing while quiet.
  void ProcessPending(bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetResidence(Block* b, Location where) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Advise(Block* b, const AdviceList& advice) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the advice in force `want` (none: nullptr), with no driver call
  // when what is in force already covers it.
  void ApplyHints(Block* b, const AllocationHints* want) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prefetches `ranges` to `target`; with `contents_dead`, the whole 2 MiB
  // pages inside them without their contents. A partial page is always
  // moved with its data: it may hold a neighbour's chunk.
  absl::Status Place(absl::Span<const Range> ranges, Location target, Stream stream,
                     bool contents_dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend* const backend_;
  const int device_count_;
  const std::size_t budget_;
  const std::function<bool()> quiet_;
  HostLedger* const ledger_;
  absl::Mutex mu_;
  // Every block carved, free or not, by address.
  absl::flat_hash_map<std::uintptr_t, std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uintptr_t, Slab> slabs_ ABSL_GUARDED_BY(mu_);
  // Free chunks per class, lowest address first (fills slabs in order, so
  // that whole slabs empty out and can be released).
  std::array<absl::btree_set<Block*, ByAddr>, kHostChunkClasses> free_chunks_ ABSL_GUARDED_BY(mu_);
  // Per class, the slab whose chunks are still being carved (0: none).
  std::array<std::uintptr_t, kHostChunkClasses> carving_ ABSL_GUARDED_BY(mu_) = {};
  absl::btree_set<Block*, BySize> free_segments_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  HostPoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_HOST_POOL_H_
