// DeviceAllocator: the caching allocator's state for one device.
//
// Internal to allocator/: CachingManagedAllocator owns one per device and is
// the public entry point. Every method takes the instance's mutex, so all are
// safe to call concurrently. Methods that reject bad input return
// kInvalidArgument and leave the state exactly as it was.
#ifndef CMA_ALLOCATOR_DEVICE_ALLOCATOR_H_
#define CMA_ALLOCATOR_DEVICE_ALLOCATOR_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/host_ledger.h"
#include "allocator/iteration_plan.h"
#include "allocator/learned_schedule.h"
#include "allocator/block.h"
#include "allocator/capture_reuse.h"
#include "allocator/discard_fence.h"
#include "allocator/mempool.h"
#include "allocator/segment_source.h"
#include "allocator/snapshot.h"
#include "allocator/sleep_plan.h"
#include "allocator/staging.h"
#include "allocator/stats.h"
#include "backends/backend.h"
#include "policy/config.h"
#include "policy/host_plan.h"
#include "policy/oversubscription.h"
#include "policy/placement_policy.h"
#include "policy/size_policy.h"

namespace cma {

// "Not allocated on this device": the caller asks the next device. Code
// only: an empty message keeps the status inline, with no allocation.
inline absl::Status NotMine() { return absl::Status(absl::StatusCode::kNotFound, ""); }

// Splits `r` into the kPageSize pages that lie wholly inside it (appended to
// `whole`) and the partial pages at its ends (appended to `partial`). A
// discard takes whole pages only: a partial page may hold a neighbour's data.
void SplitAtPages(const Range& r, std::vector<Range>* whole, std::vector<Range>* partial);

class DeviceAllocator {
 public:
  using PrivatePool = PrivatePoolState;
  using PoolContext = PoolContextState;
  // `backend` and `config` must outlive this object. The device's budget
  // (the bytes of managed memory it may reserve) and, oversubscribed, its
  // host part (policy/oversubscription.h; `host_share`: the host memory
  // this device may plan with) are planned from the device's free memory at
  // its first allocation or SetBudget, not here: reading free memory makes
  // a CUDA context, and a process that uses one GPU of several (a torchrun
  // rank) must not hold one on every other GPU.
  DeviceAllocator(int device, int device_count, Backend* backend, const AllocatorConfig* config,
                  std::size_t device_total, std::size_t host_share = 0,
                  HostLedger* host_ledger = nullptr);
  // Releases every segment, also those still handed out.
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  int device() const { return device_; }

  // `hints` (optional) is advice for this allocation only.
  absl::StatusOr<void*> Allocate(std::size_t bytes, Stream stream,
                                 const AllocationHints* hints = nullptr) ABSL_LOCKS_EXCLUDED(mu_);
  // kNotFound when `ptr` lies in none of this device's segments (the caller
  // may ask another device); kInvalidArgument for a double free or a pointer
  // into the middle of a block.
  absl::Status Free(void* ptr) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `ptr` as used by `stream`, so that a later free waits for the work
  // queued on `stream` before the memory is reused elsewhere.
  absl::Status RecordStream(void* ptr, Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns every fully-free segment to the backend.
  absl::Status EmptyCache() ABSL_LOCKS_EXCLUDED(mu_);
  // See CachingManagedAllocator::ForgetStream.
  absl::Status ForgetStream(Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // ---- private pools (mempool.cc); see CachingManagedAllocator ----
  void CreateOrIncrefPool(MemPoolId id) ABSL_LOCKS_EXCLUDED(mu_);
  // A new pool, with one reference, whose segments come from `source`
  // (allocator/segment_source.h). kInvalidArgument if the pool exists or
  // `source` is null.
  absl::Status CreatePoolWithSource(MemPoolId id, std::shared_ptr<SegmentSource> source)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool AllocatingToPool() ABSL_LOCKS_EXCLUDED(mu_);
  void BeginAllocateToPool(MemPoolId id, StreamFilter filter, PoolContextOptions options = {})
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EndAllocateToPool(MemPoolId id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReleasePool(MemPoolId id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status SetPoolOptions(MemPoolId id, PoolOptions options) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<PoolOptions> GetPoolOptions(MemPoolId id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<bool> CheckPoolLiveAllocations(MemPoolId id, absl::Span<void* const> expected)
      ABSL_LOCKS_EXCLUDED(mu_);
  // pool_checkpoint.cc
  absl::StatusOr<int> GetPoolUseCount(MemPoolId id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status EmptyPoolCache(MemPoolId id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<PoolCheckpoint> TakePoolCheckpoint(MemPoolId id) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<PoolRestoreResult> RestorePoolCheckpoint(const PoolCheckpoint& checkpoint)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Zero-copy move of allocated blocks to `target`, ordered on `stream`
  // (placement.cc). One batch call for all of `ptrs`. kNotFound if a pointer
  // is not allocated here; nothing is moved then. `target` is a valid
  // location (the caller, CachingManagedAllocator::MoveBatch, checks it).
  absl::Status Move(absl::Span<void* const> ptrs, Location target, Stream stream,
                    bool contents_dead) ABSL_LOCKS_EXCLUDED(mu_);
  // What Move refuses before any call (kFailedPrecondition: another
  // allocator's memory; kNotFound), for a batch over several devices.
  absl::Status CheckMovable(absl::Span<void* const> ptrs) ABSL_LOCKS_EXCLUDED(mu_);
  // The away state (away.cc; see CachingManagedAllocator::SendAway; away
  // or back, on `stream`). kNotFound for a pointer not allocated here;
  // every pointer is checked before any moves. `check_only`: checks alone.
  absl::Status SetAway(absl::Span<void* const> ptrs, bool away, Stream stream, bool check_only)
      ABSL_LOCKS_EXCLUDED(mu_);
  // learn_step:1 (learn_step.cc; see CachingManagedAllocator::NoteUses).
  absl::Status NoteUses(absl::Span<void* const> ptrs, Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `ptr` disposable (Sleep may discard it) until it is freed.
  absl::Status SetDisposable(void* ptr, bool disposable) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `ptr` kept by a level-2 Sleep.
  absl::Status SetKeep(void* ptr, bool keep) ABSL_LOCKS_EXCLUDED(mu_);
  // Every allocation leaves the device, ordered on `stream`, and Wake brings
  // them back (sleep.cc; see CachingManagedAllocator::Sleep). Returns bytes.
  absl::StatusOr<std::size_t> Sleep(Stream stream, SleepLevel level) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::size_t> Wake(Stream stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the staging memory; kFailedPrecondition while it holds contents.
  absl::StatusOr<std::size_t> ReleaseSleepStaging() ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the advice of the allocation at `ptr`.
  absl::Status SetHints(void* ptr, const AllocationHints& hints) ABSL_LOCKS_EXCLUDED(mu_);
  // The allocated block at `ptr`: its size as requested and its stream.
  absl::StatusOr<std::pair<std::size_t, Stream>> Lookup(void* ptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Oversubscription: while on (nested calls count), every allocation is
  // placed on the host (host_tier.cc), as an allocation that does not fit
  // the device's part is. kFailedPrecondition without a host budget.
  absl::Status SetHostRouting(bool on) ABSL_LOCKS_EXCLUDED(mu_);
  // Gives the host tier's idle segments back (their streams synchronised),
  // for the host pool when the host's cap is short; nothing while quiet.
  void ReleaseIdleHostTier() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `ptr` is an allocation of this device placed on the host.
  absl::StatusOr<bool> PlacedOnHost(void* ptr) ABSL_LOCKS_EXCLUDED(mu_);
  // An iteration of a repeating workload ends here (iteration_plan.cc): the
  // one recorded plans the next (host_plan:1, learn_step:1).
  void MarkIteration() ABSL_LOCKS_EXCLUDED(mu_);

  // Caps this device's managed memory; memory already reserved beyond the new
  // budget is kept until freed (idle cache above it is released now).
  void SetBudget(std::size_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The keys shared with PyTorch, from the next request on.
  void SetSharedSettings(const SharedSettings& s) ABSL_LOCKS_EXCLUDED(mu_);
  // The configuration this device follows now: the allocator's, with the
  // shared keys as SetSharedSettings last left them.
  AllocatorConfig LiveConfig() ABSL_LOCKS_EXCLUDED(mu_);
  std::size_t device_total() const { return device_total_; }
  DeviceStats GetStats() ABSL_LOCKS_EXCLUDED(mu_);
  // The last failure counted in num_placement_errors (a hint the backend
  // refused, a Sleep's copies that fell back to migrating, ...); OK if none.
  absl::Status LastPlacementError() ABSL_LOCKS_EXCLUDED(mu_);
  void ResetPeakStats() ABSL_LOCKS_EXCLUDED(mu_);
  // The most device bytes in live pages at once since the last call (or
  // since the allocator began), and a new window from what is live now.
  // Apart from ResetPeakStats, so that a planner's windows and the user's
  // peaks never reset each other.
  std::size_t TakeLivePeak() ABSL_LOCKS_EXCLUDED(mu_);
  void ResetAccumulatedStats() ABSL_LOCKS_EXCLUDED(mu_);
  void AppendSnapshot(std::vector<SegmentSnapshot>* out) ABSL_LOCKS_EXCLUDED(mu_);
  // Verifies that blocks tile segments, free lists hold exactly the free
  // blocks, free neighbours of one stream are merged, stats equal a recount.
  absl::Status CheckInvariants() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status CheckStream(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- the away state (away.cc) ----
  // Why `b` cannot be sent away (OK if it can); CanBeAway: and has pages to.
  absl::Status Awayable(const Block& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool CanBeAway(const Block& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::size_t InnerPageCount(absl::Span<Block* const> blocks) const;
  absl::Status CheckRoomToBringBack(absl::Span<Block* const> blocks)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MakeRoomToBringBack(std::size_t pages, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `blocks` away (or back) on `stream`: checked blocks, not yet so.
  absl::Status MoveAway(absl::Span<Block* const> blocks, bool away, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts an away block on the device again, with no transfer (a Move or
  // a Sleep places it from there); ForgetAway: at its free.
  void CountBack(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts `b`'s inner pages away (sent, or a bring back that failed).
  void CountAway(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<Range> CountBackAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // their inner pages
  void ForgetAway(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- the learned step (learn_step.cc): events, each after what is due ----
  void LearnBeforeAlloc(std::size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LearnFree(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // carries out learn_->due
  void EndLearnedStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With learn_transfer_thread: waits until every transfer call handed to
  // the transfer thread has been made (before anything that is not the
  // learned step reads or orders after the back stream's work, or a
  // capture may begin). Changes nothing the allocator shows.
  void DrainLearnedTransfers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bring-backs whose call failed on the transfer thread and that no use
  // has touched since count as away again, and as misses.
  void CollectLearnedTransferFailures() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What `b` counts in the plan.
  LearnedSchedule::Extent LearnedExtent(const Block& b, bool carried)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CheckInvariants for one arena's page maps; adds its idle pages.
  absl::Status CheckArenaPages(const Segment* seg, std::size_t* idle_pages)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `ptr` is not an allocated block: kNotFound (not this device's),
  // double free or interior pointer.
  absl::Status DiagnoseBadFree(void* ptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockPool& PoolOf(PoolKind k) { return k == PoolKind::kSmall ? small_pool_ : large_pool_; }
  // Where a free block of `seg` waits: its pool, or the host tier's.
  BlockPool& FreeListOf(const Segment* seg) {
    return ABSL_PREDICT_FALSE(seg->host_tier) ? host_pool_ : PoolOf(seg->pool);
  }
  Block*& RecentOf(PoolKind k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return recent_[k == PoolKind::kSmall ? 0 : 1];
  }
  // Moves a recently freed block into its pool's btree, queued for merging.
  void FlushRecent(Block*& recent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FlushRecent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void UpdateStat(StatArray& s, PoolKind pool, std::int64_t delta) {
    s[kAllPools].Update(delta);
    s[pool == PoolKind::kSmall ? kSmallPool : kLargePool].Update(delta);
  }

  Block* NewBlock() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DeleteBlock(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void InsertFree(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseFree(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a split block entering (+1) or leaving (-1) its pool in the
  // inactive_split statistics.
  void CountInactiveSplit(const Block* b, int sign) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  BlockPool::iterator FindFit(std::size_t rounded, PoolKind pool, Stream stream,
                              std::uint32_t mempool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the best-fitting free block of `stream` out of its pool (in an
  // arena, preferring one whose pages are populated); `fresh_pages`, if
  // given, receives how many pages its first `rounded` bytes would populate.
  Block* FindSameStream(std::size_t rounded, PoolKind pool, Stream stream, std::uint32_t mempool,
                        std::size_t* fresh_pages = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- private pools (mempool.cc) ----
  // Whether a pool context that may be a capture is open: then no query,
  // event, sync, placement or discard call is made (on a capturing stream
  // any of them would break the capture).
  bool quiet() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return capture_contexts_ != 0; }
  // The pool an allocation on `stream` goes to (0: the shared cache).
  std::uint32_t RouteToPool(Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether pool `index`'s free pages stay populated (a graph may replay
  // into them); whether it grows by arenas (PoolContextOptions::not_a_capture).
  bool PoolPagesPinned(std::uint32_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool PoolGrowsByArenas(std::uint32_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pool `index` is captured: its arenas' idle pages are pinned from now on.
  void PinPoolArenas(std::uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Where a rounded request for pool `mempool` is looked up (LookupPoolFor).
  PoolKind LookupKind(std::size_t rounded, std::uint32_t mempool) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::uint32_t PoolIndex(MemPoolId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A block of private pool `index` stopped being used; the pool goes once
  // it is released and holds nothing.
  void PoolBlockFreed(std::uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetIfDrained(std::uint32_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether a free of `b` during a capture may be reused once the capture
  // joins its streams: notes what it waits for in capture_frees_.
  void NoteCaptureFree(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees noted by NoteCaptureFree for private pool `mempool` whose marks
  // `stream`'s captured work now depends on: free in the pool again.
  void ReclaimJoinedFrees(Stream stream, std::uint32_t mempool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees that needed events on other streams while quiet: recorded now.
  void RecordDeferredFrees() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Orders `b`'s reuse after the other streams that used it: an event on
  // each (counted in pending_events), or a wait where none can be recorded.
  // Returns false when some stream could be neither fenced nor waited for;
  // those alone stay in its stream uses. Makes calls: never while quiet.
  bool FenceStreamUses(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RefuseWhileQuiet(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a failed hint or fallback (num_placement_errors) and keeps its
  // status for LastPlacementError.
  void NotePlacementError(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- checkpoints of private pools (pool_checkpoint.cc) ----
  // The index of a known pool that holds a reference, or why not.
  absl::StatusOr<std::uint32_t> ReferencedPool(MemPoolId id, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether every block over [addr, addr + size) is free in private pool
  // `index` or in `freeing` (allocations the restore frees first); else why not.
  absl::Status CheckCarvable(std::uint32_t index, std::uintptr_t addr, std::size_t size,
                             const absl::flat_hash_set<const Block*>& freeing,
                             absl::flat_hash_set<std::pair<const Segment*, std::size_t>>* fresh)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees an allocation for a restore: as Free, but it cannot fail (a stream
  // that can be neither fenced nor waited for is counted, as in
  // RecordDeferredFrees).
  void FreeForRestore(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Splits free block b at `at` (inside it); both pieces stay free where b
  // was. Returns the upper piece.
  Block* SplitFree(Block* b, std::uintptr_t at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands out [a.ptr, a.ptr + a.size), planned by CheckCarvable and freed, as
  // an allocation of private pool `index`.
  void Carve(std::uint32_t index, const PoolAllocation& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The segment holding `addr`, or nullptr.
  Segment* SegmentAt(std::uintptr_t addr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The statistics of an allocation that stops being one.
  void CountFreed(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- lookups of free blocks in other streams (lookup.cc) ----
  // Whether the work queued on `s` so far has completed (with
  // `synchronize`, after waiting for it).
  bool StreamIsIdle(Stream s, bool synchronize) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The end of stream `s`'s run of free blocks of private pool `mempool`
  // in pool `p`.
  static BlockPool::iterator StreamRunEnd(BlockPool& p, std::uint32_t mempool, Stream s);
  // Classic segments: the best-fitting free block of another, idle stream,
  // taken out of its pool.
  Block* FindCrossStream(std::size_t rounded, PoolKind pool, Stream stream, bool synchronize)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Arenas: the free blocks of other, idle streams in `pool` that could
  // serve a request of `rounded` bytes (big enough, or next to a free block)
  // become free blocks of `stream`, queued for merging with their
  // neighbours. A stream whose free blocks were all freed before it was
  // last seen idle is not asked again. Returns whether any was adopted.
  // Without `may_query` (quiet), only streams already known idle. Among
  // `mempool`'s own blocks, if given (a pool that grows by arenas).
  // Plans budget_ and host_budget_ from the device's free memory now (the
  // first call that succeeds; later calls do nothing). Its error names the
  // configuration that cannot fit, and leaves everything unplanned.
  absl::Status PlanBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error for a request larger than the device and its host part.
  absl::Status TooLarge(std::size_t bytes) const;
  absl::Status TooLarge(std::size_t bytes, std::size_t host) const;
  // The budgets PlanBudget would commit (reads the device's free memory).
  absl::StatusOr<TierBudgets> PlannedBudgets() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitBudget(const TierBudgets& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // idle_through_[s] advanced past every mark of `s` that has completed
  // (returned); the completed marks' events become spare.
  std::uint64_t PollIdleMarks(Stream s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a mark on `s` unless one covers every free so far or kIdleMarks
  // are pending; a failed call records nothing (only reuse is at stake).
  void MarkIdleLater(Stream s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AdoptIdleStreams(std::size_t rounded, PoolKind pool, Stream stream, bool synchronize,
                        bool may_query = true, std::uint32_t mempool = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Block*> NewSegment(std::size_t rounded, PoolKind pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- the host tier (host_tier.cc): oversubscription's allocations that
  // live on the host, one segment each, never split ----
  // Whether fresh pages for `rounded` bytes fit the device's part (idle
  // pages count as room: they can be discarded).
  bool DeviceHasRoomFor(std::size_t rounded) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cached host block of `stream` that holds `rounded` bytes without
  // wasting much, taken out of the host pool; null if none.
  Block* TakeHostBlock(std::size_t rounded, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new segment on the host for `rounded` bytes, advised and populated
  // there; kResourceExhausted past the host budget.
  absl::StatusOr<Block*> NewHostSegment(std::size_t rounded, PoolKind pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands out host block `b` (whole) for a request of `requested` bytes.
  void* HandOutOnHost(Block* b, std::size_t requested, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A cached host block, else a new host segment; past the host budget,
  // once more after the pending frees and the free host segments are given
  // back (the out-of-memory retry, for the host tier).
  absl::StatusOr<void*> AllocateOnHost(std::size_t rounded, std::size_t requested, PoolKind pool,
                                       Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives every wholly free host segment back, after its stream's work.
  void ReleaseFreeHostSegments() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ---- the iteration plan (iteration_plan.cc) ----
  // Whether the plan places the next allocation, of `rounded` bytes, on the
  // host; a request other than the recorded one ends the plan.
  bool PlannedOnHost(std::size_t rounded) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordAllocation(const Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RecordFree(std::uintptr_t addr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Registers backend memory as a segment holding one free block of
  // `stream` (returned); counts the segment, not its bytes.
  Block* AddSegment(void* mem, std::size_t size, PoolKind pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A block that has stopped being used (its events, if any, completed):
  // stats, page release, placement, back into its pool.
  // With `keep_recent`, the block waits in recent_ rather than in its pool.
  void BecameFree(Block* b, bool keep_recent = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- arena mode (arena.cc) ----
  bool arena_mode() const { return config_->segments == SegmentMode::kArena; }
  // Pages of the first `bytes` of free block `b` that are not populated (0
  // outside arenas). How many larger blocks a lookup checks for one that
  // needs none.
  std::size_t FreshPagesFor(const Block* b, std::size_t bytes) const;
  static constexpr int kPopulatedSearch = 8;
  // A new address range (no physical cost) as one free block of `stream`.
  absl::StatusOr<Block*> NewArena(std::size_t rounded, PoolKind pool, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes the budget room for the unpopulated pages of the first `bytes` of
  // free block `b`:
  // discards idle pages as policy/release_policy.h says (all of them with
  // `everything`). kResourceExhausted when they still do not fit.
  // Quiet (a pool is being allocated to): no discard, only the budget check.
  absl::Status MakeRoomForPages(const Block* b, std::size_t bytes, Stream stream, bool everything)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a block handed out / given back in its pages' users; pages
  // populated by the hand-out are left in populate_ for placement.
  void AcquirePages(Block* b, bool all_populated) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleasePages(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Discards up to `pages` idle pages outside [keep_lo, keep_hi), each on
  // the one stream whose free blocks cover it (a page whose free blocks
  // belong to several streams is left alone, unless `settled`: every stream
  // owning a free block has been waited for, so any of them may order it).
  // With `populating`, the stream about to populate new pages: its own idle
  // pages go first, and it waits (GPU-side) for discards on other streams;
  // then pages of several streams' free blocks, discarded on `populating`
  // after it waits (GPU-side) for each of those streams.
  // With `queued_on`, receives the streams the discards were queued on.
  // Returns the pages discarded.
  std::size_t DiscardIdlePages(std::size_t pages, std::uintptr_t keep_lo = 0,
                               std::uintptr_t keep_hi = 0, const Stream* populating = nullptr,
                               absl::flat_hash_set<Stream>* queued_on = nullptr,
                               bool settled = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for every stream that owns a free block of the shared cache in an
  // arena; true when all were waited for (DiscardIdlePages' `settled`).
  bool SettleFreeBlockStreams() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Books a discarded idle page: unpopulated, and out of every count.
  void ForgetIdlePage(Segment* seg, std::size_t page) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The idle pages wholly inside `b` leave the page map: discarded on b's
  // stream (discard_on_free), or only forgotten when a Sleep has discarded
  // them already (`already_discarded`).
  // A private pool's free blocks keep their pages unless `pool_too` (the
  // pool holds no reference, so no graph replays into them). With `from`,
  // only the pages wholly at or after it.
  void DiscardPagesInside(Block* b, bool already_discarded = false, bool pool_too = false,
                          std::uintptr_t from = 0) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Discards the dead contents of `ranges` on `stream` (DiscardBatch), but
  // with learn_step:1 they are kept (the driver evicts them by need) unless
  // the user asked for the release (ReleaseAsAsked): on the H200 the learned
  // step's transfers beside discards changed a training's results, and
  // without discards they did not (bench/results/README.md, session 5).
  // Returns whether the discard was made (false: kept, counted in
  // kept_dead_bytes).
  absl::StatusOr<bool> DiscardDead(absl::Span<const Range> ranges, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under learn_step no discard may run beside a learned transfer: every
  // call the transfer thread holds is made and both streams are waited for
  // on the host. false if a wait failed (then nothing may be discarded).
  bool SettleLearnedTransfers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ReleaseCachedSegments for empty_cache, a Sleep or a smaller budget: the
  // memory goes back to the driver also with learn_step:1 (after
  // SettleLearnedTransfers, the kept pages included), whose streams then
  // wait on the host until the driver's work behind the discards is done (a
  // host function after them), so that nothing the step populates next
  // meets it.
  std::size_t ReleaseAsAsked(std::size_t goal, absl::flat_hash_set<Stream>* queued_on = nullptr,
                             bool settled = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With learn_step:1, the pages DiscardDead kept (counted free, still
  // populated) go too: every unpopulated page inside a free block, once the
  // free blocks' streams have been waited for (none if a wait fails).
  void DiscardKeptPages(absl::flat_hash_set<Stream>* queued_on) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Orders the work queued later on `waiter` after the work queued on `on`
  // so far: an event wait on the GPU, or a host sync if events fail.
  absl::Status OrderAfter(Stream waiter, Stream on) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::size_t populated_pages() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<std::size_t>(stats_.reserved_bytes[kAllPools].current) / kPageSize;
  }
  // `all_populated`: every page of b is known to be populated already.
  // The block becomes private pool `mempool`'s; what a split leaves stays
  // where b came from.
  void* HandOut(Block* b, std::size_t rounded, std::size_t requested, PoolKind pool,
                Stream stream, std::uint32_t mempool, bool all_populated = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a block whose uses have all completed back into its pool; merging
  // with free neighbours waits for CoalesceUnmerged.
  void ReturnBlock(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges every block returned since the last call with its free
  // neighbours of the same stream. Deletes blocks: no caller may hold a
  // free block outside the pools across it.
  void CoalesceUnmerged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CoalesceUnmerged once kMaxUnmerged blocks wait, which bounds the work of
  // one pass; called only where no free block is held.
  void BoundUnmerged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static constexpr std::size_t kMaxUnmerged = 4096;
  // The placement of b after absorbing `next`: where both were, or away from
  // the device if either part was moved away.
  void MergePlacement(Block* b, const Block& next) const;
  // The rule of MergePlacement on values (snapshots merge free neighbours
  // for their readers the same way): `placed` false means unplaced.
  struct Placement {
    bool placed = false;
    Location location;
  };
  static Placement MergedPlacement(Placement a, Placement b, Location home);
  static bool Mergeable(const Block* neighbour, const Block* b) {
    return neighbour != nullptr && neighbour->is_free() && neighbour->stream == b->stream &&
           neighbour->mempool == b->mempool && !neighbour->no_split && !b->no_split;
  }
  // Cuts block b (out of the free lists, or allocated) at `at`, inside it:
  // b keeps the lower part; the upper part, returned, is a new block with
  // b's stream, pool and placement, not yet in any list.
  Block* SplitAt(Block* b, std::uintptr_t at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A private pool grows by a segment of its own of the request's segment
  // size (SegmentSizeFor), as PyTorch's tools expect of a capture's pool, or
  // by arenas of its own (PoolGrowsByArenas); its memory goes back whole once
  // the pool is released and wholly free (ReleaseIdleSegments). A pool with a
  // SegmentSource takes its segments from it. Returns the new block.
  absl::StatusOr<Block*> NewPoolSegment(std::size_t rounded, PoolKind pool, Stream stream,
                                        std::uint32_t mempool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One allocation of `size` bytes from the backend (or from the
  // SegmentSource of private pool `mempool`, when it has one), reserved
  // whole, refused when it would take reserved bytes past the budget.
  absl::StatusOr<Block*> NewClassicSegment(std::size_t size, PoolKind pool, Stream stream,
                                           std::uint32_t mempool = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether private pool `index` is released (no reference, no context) and
  // waits only for its blocks in use: its wholly free segments may go.
  bool PoolReleased(std::uint32_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether private pool `mempool` hands its blocks out whole (no_split).
  bool NoSplit(std::uint32_t mempool) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Out of memory: a free block of a live use_on_oom pool other than
  // `mempool` that serves the request, handed out as that pool's, or null.
  void* TakeFromUseOnOomPools(std::size_t rounded, std::size_t requested, Stream stream,
                              std::uint32_t mempool, const AllocationHints* hints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Merges b->next, a free block of b's stream, into b (b is out of the pool).
  void AbsorbNext(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::StatusOr<Event> TakeEvent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ProcessPendingFrees(bool synchronize) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `goal` bytes of idle cache back (all of it when goal is 0): whole
  // segments in classic mode, idle pages (stream-ordered discards, no sync)
  // in arena mode; `queued_on` and `settled` as DiscardIdlePages's.
  // Returns the bytes released.
  std::size_t ReleaseCachedSegments(std::size_t goal,
                                    absl::flat_hash_set<Stream>* queued_on = nullptr,
                                    bool settled = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseSegment(Segment* seg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether memory a SegmentSource returned can be a segment: a non-null,
  // 256-byte aligned range (kInternal) overlapping no segment held
  // (kAlreadyExists).
  absl::Status CheckSourcedRange(void* mem, std::size_t size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives a segment's memory back to where it came from: its source, or
  // the backend.
  absl::Status FreeSegmentMemory(const Segment& seg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Classic segments and arenas alike: frees the fully-free ones (largest
  // first, `goal` bytes of address space; all when 0) after synchronising
  // their streams.
  // With `mempool` (a pool with no reference), only segments that hold some
  // of its free blocks and otherwise only the shared cache's or released
  // pools'. With `classic_only`, no arena nor host-tier segment (the device
  // memory classic segments hold, nothing else).
  std::size_t ReleaseIdleSegments(std::size_t goal, std::uint32_t mempool = 0,
                                  bool classic_only = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string OomMessage(std::size_t bytes, const absl::Status& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- placement (placement.cc) ----
  // Carries out `action` for `ranges`; counts it in the stats. With `via`,
  // a prefetch is handed to that thread (its failure counted at the end of
  // the learned step) and the returned ticket is its call's.
  absl::Status Execute(PlacementAction action, absl::Span<const Range> ranges, Location target,
                       Stream stream, TransferThread* via = nullptr,
                       std::uint64_t* ticket = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyAdvice(const AdviceList& advice, void* ptr, std::size_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Config advice and, with prefetch:on_alloc, one prefetch of the whole new
  // segment (which places every small block later carved from it).
  void PrepareSegment(Block* whole, Stream stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlaceForAllocation(Block* b, Stream stream, const AllocationHints* hints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlaceArenaBlock(Block* b, Stream stream, Location target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlaceSegmentBlock(Block* b, Stream stream, Location target)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At free: withdraws the allocation's advice; with discard_on_free, marks
  // the contents dead on the block's stream.
  void OnFreed(Block* b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether b's memory may be moved (kFailedPrecondition for another
  // allocator's).
  static absl::Status Movable(const Block& b);

  // ---- sleep staging (sleep.cc) ----
  // Brings the staged contents of `blocks` (those in staged_) back into
  // their whole pages, populated at `target`, ordered on `stream` after the
  // Sleep; with `contents_dead` they are only forgotten. The others are
  // left alone.
  absl::Status RestoreStaged(absl::Span<Block* const> blocks, Location target, Stream stream,
                             bool contents_dead) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The block at `addr` no longer has contents in the staging area.
  void Unstage(std::uintptr_t addr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sleep's staging of `parts` (the bytes of kept blocks that leave, in
  // address order): copies into the staging as chunks become available
  // (growing the area while the copy engine works on the chunks before),
  // recording each block staged in staged_; the parts that do not fit the
  // bound or the memory available are appended to `migrate`.
  struct StagedBlock {
    Block* block;
    Range bytes;  // copied: the part, up to the requested size
    Range pages;  // whose pages go once staged: the whole part
  };
  void StageOut(absl::Span<const StagedBlock> parts, Stream stream, std::vector<Range>* migrate)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wake's share of slept_edge_pages_ (emptied): the pages the page map
  // still counts populated, in address order.
  std::vector<Range> TakeSleptEdgePages() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `ranges` (each inside the segments) cut where one segment ends.
  std::vector<Range> SplitAtSegments(std::vector<Range> ranges)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records the first and last pages of `parts` that lie in `discarded`
  // (sorted, disjoint) in slept_edge_pages_.
  void RememberEdgePages(absl::Span<const Range> parts, absl::Span<const Range> discarded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a Sleep's discard on `stream`: the free `blocks` on its pages
  // are used next only after it (allocator/sleep.cc says how).
  absl::Status OrderFreeBlocksAfter(absl::Span<Block* const> blocks, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Populates the pages of `plan` at `target` and copies the staged bytes
  // back, on `stream`.
  absl::Status CopyBack(const RestorePlan& plan, Location target, Stream stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  const int device_count_;
  Backend* const backend_;
  // This device's copy of the configuration: SetSharedSettings changes its
  // shared keys under mu_, where every reader of them runs; the other keys
  // never change.
  AllocatorConfig config_copy_;
  const AllocatorConfig* const config_;
  const std::size_t device_total_;
  const std::size_t host_share_;
  // Planned by PlanBudget (once it succeeds); SetBudget's bytes win over
  // the planned budget.
  bool budget_planned_ ABSL_GUARDED_BY(mu_) = false;
  bool budget_set_ ABSL_GUARDED_BY(mu_) = false;
  std::size_t budget_ ABSL_GUARDED_BY(mu_) = 0;
  // Written once, by PlanBudget under mu_; read anywhere.
  std::atomic<std::size_t> host_budget_{0};
  // Shared with the host pool and the other devices' tiers (may be null).
  HostLedger* const host_ledger_;
  int host_routing_ ABSL_GUARDED_BY(mu_) = 0;  // SetHostRouting's nesting
  // learn_step:1: the step learnt and its replay (null when off).
  std::unique_ptr<LearnState> learn_ ABSL_GUARDED_BY(mu_);
  IterationRecord iteration_ ABSL_GUARDED_BY(mu_);  // host_plan:1

  absl::Mutex mu_;
  BlockPool small_pool_ ABSL_GUARDED_BY(mu_);
  BlockPool large_pool_ ABSL_GUARDED_BY(mu_);
  BlockPool host_pool_ ABSL_GUARDED_BY(mu_);  // free blocks of host-tier segments
  // Per pool, the block the last Free returned, kept out of the btree (an
  // alloc/free cycle of one size neither erases nor inserts); counted free
  // and in its pool, moved into the btree before any other lookup or merge.
  Block* recent_[2] ABSL_GUARDED_BY(mu_) = {nullptr, nullptr};
  absl::flat_hash_map<std::uintptr_t, Block*> allocated_ ABSL_GUARDED_BY(mu_);
  absl::btree_map<std::uintptr_t, Segment*> segments_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Stream> known_streams_ ABSL_GUARDED_BY(mu_);
  struct PendingFree {
    Block* block;
    Event event;
  };
  std::vector<PendingFree> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> spare_events_ ABSL_GUARDED_BY(mu_);
  std::vector<Block*> spare_blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<Block*> unmerged_ ABSL_GUARDED_BY(mu_);  // may hold stale entries
  std::vector<Range> populate_ ABSL_GUARDED_BY(mu_);  // arena pages the last hand-out populated
  std::size_t idle_pages_ ABSL_GUARDED_BY(mu_) = 0;   // arena pages populated with no users
  std::size_t pinned_idle_pages_ ABSL_GUARDED_BY(mu_) = 0;  // of those, in Segment::pinned ones
  std::size_t peak_live_pages_ ABSL_GUARDED_BY(mu_) = 0;  // most arena pages ever in use
  std::size_t window_live_pages_ ABSL_GUARDED_BY(mu_) = 0;  // the same since TakeLivePeak
  bool release_asked_ ABSL_GUARDED_BY(mu_) = false;  // inside ReleaseAsAsked
  // Both peaks of live pages follow a change that may have raised them.
  void NoteLivePages() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::size_t live = populated_pages() - idle_pages_;
    peak_live_pages_ = std::max(peak_live_pages_, live);
    window_live_pages_ = std::max(window_live_pages_, live);
  }
  // Frees so far (Block::free_seq), and per stream the count at the last
  // moment its queued work was seen complete: its free blocks numbered up to
  // that are idle.
  std::uint64_t free_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<Stream, std::uint64_t> idle_through_ ABSL_GUARDED_BY(mu_);
  // Per stream, events recorded on it when a request found its free blocks
  // not yet idle and the stream busy (AdoptIdleStreams), each with free_seq_
  // when recorded: once one has completed, the blocks numbered up to it are
  // idle although the stream never was when asked (FSDP2's communication
  // streams rarely are). At most kIdleMarks pending per stream.
  struct IdleMark {
    Event event;
    std::uint64_t seq;
  };
  static constexpr std::size_t kIdleMarks = 2;
  absl::flat_hash_map<Stream, std::vector<IdleMark>> idle_marks_ ABSL_GUARDED_BY(mu_);
  Stream last_stream_ ABSL_GUARDED_BY(mu_) = kDefaultStream;  // last validated
  // The stream of the last Sleep or Wake: each Sleep and Wake is ordered
  // after the one before, and so are the free or Move of a block whose
  // pages a Sleep discarded.
  Stream sleep_wake_stream_ ABSL_GUARDED_BY(mu_) = kDefaultStream;
  // Allocations whose contents (all, or all but what sits on pages that
  // stayed) a Sleep copied into staging_ before discarding their pages, by
  // block address: where in staging_, and which bytes.
  struct Staged {
    std::size_t offset;
    Range bytes;
  };
  absl::flat_hash_map<std::uintptr_t, Staged> staged_ ABSL_GUARDED_BY(mu_);
  StagingArea staging_ ABSL_GUARDED_BY(mu_);
  // Pages shared by several blocks (an allocation's edge pages) that a
  // Sleep discarded, by address. The page map goes on counting them
  // populated while asleep (as it does a sleeping block's own pages);
  // Wake populates every one it still counts, in use or not.
  absl::flat_hash_set<std::uintptr_t> slept_edge_pages_ ABSL_GUARDED_BY(mu_);
  // Streams other than sleep_wake_stream_ that a Move's restore read
  // staging_ on: the next Sleep writes there only after them.
  absl::flat_hash_set<Stream> staging_readers_ ABSL_GUARDED_BY(mu_);
  // Orders the next population of a Sleep's discarded pages after the
  // driver's work behind the discards (wake_fence).
  DiscardFence discard_fence_ ABSL_GUARDED_BY(mu_);
  DeviceStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Status last_placement_error_ ABSL_GUARDED_BY(mu_);

  absl::flat_hash_map<MemPoolId, std::uint32_t> mempool_index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::uint32_t, PrivatePool> mempools_ ABSL_GUARDED_BY(mu_);
  std::uint32_t next_mempool_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<PoolContext> contexts_ ABSL_GUARDED_BY(mu_);  // pools being allocated to
  int capture_contexts_ ABSL_GUARDED_BY(mu_) = 0;  // of contexts_, those not not_a_capture
  // Freed while quiet but used on other streams: out of the pools, counted
  // as awaiting one event, until RecordDeferredFrees (which keeps here, for
  // a later try, those it could not order after a stream that used them).
  std::vector<Block*> deferred_ ABSL_GUARDED_BY(mu_);
  // Those of deferred_ freed during a capture into a pool whose context
  // reuses after joins: what each waits for (allocator/capture_reuse.h).
  absl::flat_hash_map<Block*, CaptureFree> capture_frees_ ABSL_GUARDED_BY(mu_);
  // Segments made while quiet: their config advice waits for the last pool
  // context's end.
  std::vector<std::uintptr_t> unadvised_ ABSL_GUARDED_BY(mu_);  // segment bases
};

}  // namespace cma

#endif  // CMA_ALLOCATOR_DEVICE_ALLOCATOR_H_
