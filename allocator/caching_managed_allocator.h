// CachingManagedAllocator: a stream-aware caching allocator over managed
// (unified) memory, one pool state per device.
//
//   auto backend = cma::MakeBackend("best");                 // cuda, hip or host
//   auto alloc = cma::CachingManagedAllocator::Create(*backend, "max_split_size_mb:256");
//   void* p = (*alloc)->Allocate(1 << 20, /*device=*/0, stream).value();
//   (*alloc)->RecordStream(p, other_stream);   // p is also used on other_stream
//   (*alloc)->Free(p);
//
// Reuse follows stream order, as in PyTorch: a block freed on stream S is
// reusable at once by S, and by another stream only once the work queued on
// S and on every stream named by RecordStream has completed.
//
// Thread safety: every method may be called concurrently; each device has its
// own lock. Ownership: the backend must outlive the allocator; the allocator
// returns all its memory to the backend when destroyed (pointers still handed
// out become invalid). Errors: bad input (size 0 or larger than the device,
// invalid device or stream, a foreign pointer, a double free) returns
// kInvalidArgument naming the problem and changes nothing; out of memory
// returns kResourceExhausted with the allocator's statistics in the message,
// after one retry that waits for pending frees and releases the cache.
#ifndef CMA_ALLOCATOR_CACHING_MANAGED_ALLOCATOR_H_
#define CMA_ALLOCATOR_CACHING_MANAGED_ALLOCATOR_H_

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/device_allocator.h"
#include "allocator/host_pool.h"
#include "allocator/mempool.h"
#include "allocator/segment_source.h"
#include "allocator/snapshot.h"
#include "allocator/stats.h"
#include "backends/backend.h"
#include "policy/config.h"

namespace cma {

class CachingManagedAllocator {
 public:
  static absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> Create(Backend& backend,
                                                                         AllocatorConfig config);
  // Parses `config` as CMA_ALLOC_CONF text first.
  static absl::StatusOr<std::unique_ptr<CachingManagedAllocator>> Create(Backend& backend,
                                                                         absl::string_view config);

  // The device number of CPU-side memory (the host pool, allocator/host_pool.h).
  static constexpr int kHostDevice = -1;

  // Memory for use in stream order on `stream`: work queued later on
  // `stream` may use it at once; the host, or another stream, only after
  // synchronising with `stream` (placement may still be in flight, as with
  // cudaMallocAsync). `hints` is advice for this allocation only.
  // device kHostDevice: CPU-side memory from the host pool, usable by the
  // CPU at once (`stream` is ignored; `hints` must be null). Free, Move,
  // RecordStream, RequestedSize and EmptyCache serve it as any allocation.
  absl::StatusOr<void*> Allocate(std::size_t bytes, int device, Stream stream = kDefaultStream,
                                 const AllocationHints* hints = nullptr);
  absl::Status Free(void* ptr);
  absl::Status RecordStream(void* ptr, Stream stream);
  // Returns every fully-free cached segment of every device to the backend.
  absl::Status EmptyCache();
  // Call before destroying `stream`: waits for the work queued on it, then
  // makes its cached blocks any stream's and drops it from every allocation
  // that named it (RecordStream), so the allocator never names it to the
  // backend again and EmptyCache can release its memory. Allocations made on
  // it stay valid; their later frees are ordered on the default stream.
  // kInvalidArgument for the default stream; a failed wait changes nothing.
  absl::Status ForgetStream(Stream stream);

  // Zero-copy move (PyTorch RFC-0023's tensor.to() without a copy): the
  // allocation keeps its address and its data migrates to `target`, ordered
  // on `stream` after the work already queued there. Work queued later on
  // `stream` sees the data in place; the host must SynchronizeStream(stream)
  // before touching data moved to it. `contents_dead` discards instead of
  // migrating (the caller will overwrite everything). The block keeps
  // belonging to the device that allocated it (its pool and budget); its
  // recorded location follows the move, so a later reuse knows where it is.
  absl::Status Move(void* ptr, Location target, Stream stream, bool contents_dead = false);
  // Several allocations in one batch call per device (e.g. a model's tensors).
  absl::Status MoveBatch(absl::Span<void* const> ptrs, Location target, Stream stream,
                         bool contents_dead = false);
  // The away state (issue 48): a live allocation whose data waits on the
  // host while the work does not need it, so that the device's part holds
  // what it needs next. SendAway prefetches the 2 MiB pages strictly inside
  // each allocation (its first and last page may hold neighbours' data and
  // stay) to the host, ordered on `stream` after the work queued there and
  // on the allocation's own stream (an event, no host sync), and
  // they stop counting in reserved_bytes (away_bytes counts them);
  // BringBack prefetches them to the device again, ordered the same way,
  // discarding idle cached pages when the budget needs the room. Same
  // addresses, data kept; a kernel that touches an away allocation reads
  // and writes it correctly (the pages migrate on demand, slower, and count
  // again only when brought back). `stream` must be of the allocation's
  // device; the allocation's free then waits for it, as after RecordStream.
  // Each call checks every pointer, and the room, before any moves and
  // changes nothing if one fails: kInvalidArgument for a pointer that is not
  // a live allocation of this allocator or a bad stream; kFailedPrecondition
  // for one that cannot be away (the host's, the host tier's, a private
  // pool's, another allocator's, a classic segment's, one a Sleep left) or
  // while a pool is being allocated to; BringBack's kResourceExhausted when
  // the device's part cannot hold them even with every idle page discarded.
  // (Idle pages that free blocks of several streams share are discarded
  // after waiting for those streams; only a backend failure then, counted in
  // num_placement_errors, can leave a batch over several devices moved on
  // some and not on others.) Sending an away allocation, or bringing back
  // one that is not, is a no-op. A Move to its device counts an away
  // allocation back with the room BringBack needs (or is refused the same
  // way); a Move to the host leaves it away; a Sleep counts every away
  // allocation back (Wake then brings it to the device with the rest).
  absl::Status SendAway(absl::Span<void* const> ptrs, Stream stream);
  absl::Status BringBack(absl::Span<void* const> ptrs, Stream stream);
  // Sleep mode, as vLLM's (which unmaps and remaps), keeping addresses:
  // every allocation of `device` leaves it, ordered on `stream`, so that its
  // memory is reclaimable by the driver (another process's cudaMalloc can
  // take it); Wake brings them back. Same addresses, nothing re-created.
  // What survives depends on `level` (allocator/staging.h):
  //  * kOffload (vLLM's level 1, the default): every allocation not marked
  //    disposable keeps its contents. Its whole 2 MiB pages are copied into
  //    pinned host staging and discarded on the device; Wake populates them
  //    again and copies back, each way at the copy engine's speed. The
  //    staging stays allocated across cycles (host_staging_bytes in the
  //    stats, at most `sleep_staging_max` of the config) until
  //    ReleaseSleepStaging; what does not fit, or where the backend has no
  //    pinned memory, migrates as with kMigrate. While asleep, a staged
  //    allocation's contents are reachable only through Wake or Move (which
  //    restores them wherever it moves them): reading its pages otherwise
  //    sees garbage.
  //  * kDiscard (vLLM's level 2): only allocations marked keep (SetKeep)
  //    keep their contents, as above; all others are discarded.
  //  * kMigrate: kept contents migrate to the host (a prefetch) and stay
  //    readable there while asleep; slower (host page population).
  // Disposable allocations (a KV cache) are always discarded, and Wake
  // populates discarded pages rather than migrating them. Discards take
  // whole 2 MiB pages only: a page at an allocation's end goes with it when
  // everything else on it is free or leaves too (staged or discarded);
  // otherwise the allocation's bytes there migrate. Ordering, all on the GPU with
  // no host sync: Sleep runs after the work already queued on every stream
  // that uses an allocation (its own and those named by RecordStream) and
  // after the last Wake; Wake runs after the Sleep, and work queued later
  // on any of those streams runs after the Wake. The host synchronises
  // `stream` before it touches the data. Returns the bytes of the
  // allocations. kInvalidArgument for a bad level, device or stream.
  absl::Status SetDisposable(void* ptr, bool disposable);
  absl::Status SetKeep(void* ptr, bool keep);
  absl::StatusOr<std::size_t> Sleep(int device, Stream stream,
                                    SleepLevel level = SleepLevel::kOffload);
  absl::StatusOr<std::size_t> Wake(int device, Stream stream);
  // Gives the device's staging memory back to the host (waiting for the
  // copies out of it); returns the bytes. kFailedPrecondition, changing
  // nothing, while it holds contents (between a Sleep and its Wake). The
  // next Sleep pins it again (its first-cycle cost).
  absl::StatusOr<std::size_t> ReleaseSleepStaging(int device);
  // Replaces the advice (read-mostly, preferred location, accessed-by) of
  // one allocation; withdrawn again when it is freed.
  absl::Status SetHints(void* ptr, const AllocationHints& hints);

  // ---- private pools (allocator/mempool.h), with PyTorch's semantics ----
  // A MemPool takes a reference on creation and gives it back with
  // ReleasePool. BeginAllocateToPool (which also takes a reference) routes
  // the allocations of `device` from the streams `filter` accepts (all, if
  // null) to pool `id` until EndAllocateToPool; blocks handed out for the
  // pool serve only it, also after their free, until it is released and
  // empty. While a context that may be a capture is open on a device (one
  // begun without PoolContextOptions::not_a_capture, or any context of a
  // pool a capture has used), that device's allocator makes no query,
  // event, sync, placement or discard call: allocations come from cached
  // or new pages without prefetch (first touch places them), frees that
  // need events, syncs or advice are finished when the last such context
  // ends, and EmptyCache, ForgetStream (any device's context), Sleep, Wake,
  // Move, SetHints and Allocate with hints (that device's) return
  // kFailedPrecondition and change nothing. No memory is freed meanwhile.
  // A captured pool's free blocks are never discarded or released while it
  // lives (a graph replays into them); a pool only not-a-capture contexts
  // used gives its idle pages back as the shared cache does. Errors:
  // kInvalidArgument for a bad device, an end without a begin, a release
  // without a reference, an unknown pool.
  absl::Status CreateOrIncrefPool(int device, MemPoolId id);
  // A new pool (one reference) whose segments come from another allocator
  // (allocator/segment_source.h): PyTorch's MemPool(allocator=...). From
  // then on it is a pool like any other. kInvalidArgument, changing
  // nothing, if the pool exists or `source` is null.
  absl::Status CreatePoolWithSource(int device, MemPoolId id,
                                    std::shared_ptr<SegmentSource> source);
  // `options` (allocator/mempool.h): how frees during the context are reused.
  absl::Status BeginAllocateToPool(int device, MemPoolId id, StreamFilter filter,
                                   PoolContextOptions options = {});
  absl::Status EndAllocateToPool(int device, MemPoolId id);
  absl::Status ReleasePool(int device, MemPoolId id);
  // PyTorch's MemPool(no_split=, use_on_oom=) (allocator/mempool.h
  // PoolOptions) for a pool that holds a reference; kInvalidArgument
  // otherwise, changing nothing.
  absl::Status SetPoolOptions(int device, MemPoolId id, PoolOptions options);
  absl::StatusOr<PoolOptions> GetPoolOptions(int device, MemPoolId id);
  // Whether a context that may be a capture is open on `device`, the
  // allocator quiet (false for a bad device).
  bool AllocatingToPool(int device);
  // Whether the pool's live allocations are exactly `expected` (PyTorch's
  // checkPoolLiveAllocations, used by torch.compile's cudagraph trees).
  absl::StatusOr<bool> CheckPoolLiveAllocations(int device, MemPoolId id,
                                                absl::Span<void* const> expected);
  // References on the pool: MemPool objects (CreateOrIncrefPool) and
  // contexts (BeginAllocateToPool) not yet given back by ReleasePool
  // (PyTorch's getPoolUseCount): 0 for a released pool that still drains.
  // kInvalidArgument for an unknown pool (one never made, or one whose
  // segments have all gone back).
  absl::StatusOr<int> GetPoolUseCount(int device, MemPoolId id);
  // PyTorch's emptyCache(mempool_id): once a pool holds no reference (it is
  // released but some of its allocations live), its idle memory goes back
  // as EmptyCache gives back the shared cache's: classic segments wholly
  // free (in this pool, or in it and the shared cache) are freed, and in
  // arenas the idle pages inside its free blocks are discarded. A pool with
  // references keeps everything (a CUDA graph may replay into its free
  // blocks) and an unknown pool (its segments all gone back) has nothing;
  // both return OK, as PyTorch does.
  // kFailedPrecondition while a pool context of the device is open.
  absl::Status EmptyPoolCache(int device, MemPoolId id);
  // The pool's live allocations, for RestorePoolCheckpoint. Refused
  // (kFailedPrecondition) for a pool that holds no reference, as PyTorch
  // refuses to checkpoint a freeable pool; kInvalidArgument for an unknown
  // pool or a bad device.
  absl::StatusOr<PoolCheckpoint> TakePoolCheckpoint(int device, MemPoolId id);
  // Makes the pool's live allocations exactly the checkpoint's (PyTorch's
  // setCheckpointPoolState): frees those live now and not in the
  // checkpoint, and re-creates each allocation of the checkpoint at its
  // address, size, requested size and stream, carved out of the pool's free
  // blocks (merged across streams, each later use ordered after the
  // streams that freed them). One live now with the checkpoint's address
  // and size stays in place (it takes the checkpoint's requested size and
  // stream). No data moves and no placement is made: the memory holds
  // what the graph replays left there. Plans first, then applies: if any
  // range is not wholly free in the pool (or held by a live allocation of
  // the pool that is used by another stream through RecordStream or is
  // asleep), the pool holds no reference, a context of the device is open,
  // a stream is invalid or new pages would exceed the budget, it returns an
  // error (kFailedPrecondition, kInvalidArgument, kResourceExhausted) and
  // changes nothing.
  absl::StatusOr<PoolRestoreResult> RestorePoolCheckpoint(const PoolCheckpoint& checkpoint);

  // The device that owns `ptr` (a pointer returned by Allocate and not freed).
  absl::StatusOr<int> DeviceOf(void* ptr);
  // The bytes requested for the allocation at `ptr` (a zero-copy .to()
  // checks that a tensor's storage is the whole allocation).
  absl::StatusOr<std::size_t> RequestedSize(void* ptr);

  int device_count() const { return static_cast<int>(devices_.size()); }
  const AllocatorConfig& config() const { return config_; }
  Backend& backend() const { return backend_; }

  absl::StatusOr<DeviceStats> GetStats(int device);
  DeviceStats GetStats();  // summed over devices
  HostPoolStats GetHostStats() { return host_->GetStats(); }
  void ResetHostPeakStats() { host_->ResetPeakStats(); }
  // The last failure num_placement_errors counted on `device` (a hint the
  // backend refused, a Sleep's copies that fell back to migrating, ...):
  // its message, "" if none.
  absl::StatusOr<std::string> LastPlacementError(int device);
  // Managed-memory budget of one device: `fraction` in [0, 1] of its total
  // memory (PyTorch's set_per_process_memory_fraction; 0 refuses every
  // allocation, as PyTorch's does).
  absl::Status SetMemoryFraction(double fraction, int device);
  // Applies the keys shared with PyTorch (max_split_size_mb,
  // roundup_power2_divisions, garbage_collection_threshold) of a PyTorch
  // allocator settings string to every device, from each one's next request
  // on; a shared key the string does not name takes CMA_ALLOC_CONF's value
  // again (PyTorch's settings replace each other whole), and other keys are
  // ignored (policy/config.h: ParsePyTorchSharedSettings). A bad value is
  // kInvalidArgument naming the key, and nothing changes. config() stays the
  // configuration the allocator was created with.
  absl::Status ApplyPyTorchSettings(absl::string_view pytorch_settings);
  // The configuration in force now: config() with the shared keys as the
  // last ApplyPyTorchSettings left them (every device follows the same).
  AllocatorConfig LiveConfig();
  // Oversubscription (config oversubscribe:1, policy/oversubscription.h):
  // while routing is on for `device` (nested calls count), its allocations
  // are placed on the host, as those that do not fit the device's part of
  // the budget are; a hint for allocations touched about once per step,
  // such as an optimizer's state. kFailedPrecondition without
  // oversubscription, or to turn off what is not on; kInvalidArgument for a
  // bad device. Thread-safe.
  absl::Status SetHostRouting(int device, bool on);
  // Oversubscription: an iteration of a repeating workload (a training
  // step) ends on `device`: the one recorded since the last call plans
  // which of the next one's allocations live on the host
  // (policy/host_plan.h), followed while the requests repeat. A no-op
  // without oversubscription and host_plan:1; kInvalidArgument for a bad
  // device.
  // With learn_step:1 (allocator/learned_schedule.h) it also ends the step
  // the allocator learns, and begins the next.
  absl::Status MarkIteration(int device);
  // learn_step:1: one use, by work queued next on `stream` (a kernel, a
  // module's forward), of the allocations at `ptrs` (the framework's
  // reports are the step's clock). Pointers that are not allocation starts
  // of `device` are ignored. Work queued on `stream` after this call waits
  // for a bring back of these allocations already under way.
  // kFailedPrecondition without learn_step:1; kInvalidArgument for a bad
  // device or stream.
  absl::Status NoteUses(int device, absl::Span<void* const> ptrs, Stream stream);
  // Whether the allocation at `ptr` lives on the host (oversubscription);
  // kInvalidArgument for a pointer this allocator did not hand out.
  absl::StatusOr<bool> PlacedOnHost(void* ptr);
  absl::Status ResetPeakStats(int device);
  // The most device bytes in live pages (arena mode) at once since the last
  // call for `device`, and a new window from now (DeviceAllocator::
  // TakeLivePeak; independent of ResetPeakStats). kInvalidArgument for a
  // bad device.
  absl::StatusOr<std::size_t> TakeLivePeak(int device);
  // Zeroes each statistic's allocated and freed totals and the counters
  // (num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc,
  // num_device_free and cma's own event counters), as PyTorch's
  // resetAccumulatedStats; current and peak values stay.
  absl::Status ResetAccumulatedStats(int device);
  std::vector<SegmentSnapshot> Snapshot();
  // The host pool's live allocations (device kHostDevice: CPU tensors in
  // managed memory), by address; each block's location says where its
  // pages were last moved. Snapshot() has only the devices' segments.
  std::vector<BlockSnapshot> HostSnapshot() { return host_->Snapshot(); }
  // The invariant checker (see DeviceAllocator::CheckInvariants) on every device.
  absl::Status CheckInvariants();

 private:
  // SendAway and BringBack: grouped by device, all checked before any acts.
  absl::Status SetAway(absl::Span<void* const> ptrs, bool away, Stream stream);
  CachingManagedAllocator(Backend& backend, AllocatorConfig config)
      : backend_(backend), config_(std::move(config)) {}
  absl::StatusOr<DeviceAllocator*> Device(int device);
  absl::Status BadDevice(int device) const;
  // kFailedPrecondition naming `what` if any device has a pool context open.
  absl::Status RefuseWhileAnyPoolContext(const char* what);
  absl::Status CheckHints(const AllocationHints& hints) const;

  Backend& backend_;
  const AllocatorConfig config_;
  // Declared first, destroyed last: the host pool and the devices' host
  // tiers give back to it as they go.
  std::unique_ptr<HostLedger> host_ledger_;
  // Whether `bytes` more would pass the host's shared cap now.
  bool HostCapShort(std::size_t bytes) const {
    return host_ledger_->held() > host_ledger_->cap() - std::min(bytes, host_ledger_->cap());
  }
  std::vector<std::unique_ptr<DeviceAllocator>> devices_;
  std::unique_ptr<HostPool> host_;
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_CACHING_MANAGED_ALLOCATOR_H_
