/* cma_c.h: the C ABI of caching_managed_allocator, for frameworks (PyTorch's
 * allocator class in cma/torch/_ext/cuda_allocator.cc, CuPy, Numba, anything with
 * ctypes).
 *
 * One process-wide allocator. cma_init creates it (later calls with the same
 * arguments are no-ops; different ones fail); every other entry point
 * creates it on first use from CMA_ALLOC_CONF and CMA_BACKEND.
 *
 * Streams are the vendor's stream handles (cudaStream_t) passed as void*;
 * NULL is the default stream. A location is a device index, or -1 for the
 * host.
 *
 * Errors: functions returning int give 0 on success and -1 on failure;
 * pointer-returning ones give NULL. cma_last_error() then describes the
 * failure and cma_last_error_code() its kind (per thread, valid until the
 * thread's next failing call).
 * Strings returned by cma_*_json must be released with cma_string_free.
 * Thread safety: every function may be called from any thread. */
#ifndef CMA_INTEGRATIONS_C_CMA_C_H_
#define CMA_INTEGRATIONS_C_CMA_C_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

int cma_init(const char* config, const char* backend);
/* Releases every allocation and the allocator itself. */
void cma_shutdown(void);
const char* cma_backend_name(void);
int cma_device_count(void);
/* The device's free and total memory as its backend reports them. */
int cma_mem_info(int device, size_t* free_bytes, size_t* total_bytes);
const char* cma_last_error(void);
/* The kind of the last failure, as absl::StatusCode numbers: 3 invalid
 * argument, 5 not found, 8 out of memory (resource exhausted), ... */
int cma_last_error_code(void);

/* device -1: CPU-side memory from the host pool (managed memory populated
 * on the host, usable by the CPU at once; `stream` is ignored). cma_move
 * takes it to a GPU and back without a copy; cma_free, cma_record_stream and
 * cma_allocation_size serve it as any allocation; statistics in
 * cma_host_stats_json. */
void* cma_malloc(size_t size, int device, void* stream);
int cma_free(void* ptr);
int cma_record_stream(void* ptr, void* stream);
/* Zero-copy move of an allocation to `location`, ordered on `stream`.
 * The host must cma_synchronize(stream) before touching data moved to it. */
int cma_move(void* ptr, int location, void* stream, int contents_dead);
/* The away state: `n` live allocations (one batch; each checked before any
 * moves) send the 2 MiB pages strictly inside them to the host, ordered on
 * `stream` (a stream of their device), where they stop counting in
 * reserved_bytes (away_bytes counts them) until cma_bring_back prefetches
 * them to the device again. Same addresses, data kept; a kernel that
 * touches an away allocation still works (its pages migrate on demand).
 * -1 with cma_last_error_code 3 (a pointer not allocated here, n < 0),
 * 9 (failed precondition: host memory, a private pool's, a classic
 * segment's, a sleeping one) or 8 (bring back: the budget has no room). */
int cma_send_away(void* const* ptrs, int n, void* stream);
int cma_bring_back(void* const* ptrs, int n, void* stream);
/* Sleep mode (vLLM's, addresses kept), ordered on `stream`: every
 * allocation of `device` leaves it and the idle cache is given back, so
 * that the device memory is reclaimable by others; cma_wake brings them
 * back. cma_sleep_level's `level`: 1 (cma_sleep's) keeps every allocation
 * not marked disposable, copied through pinned host staging that stays
 * allocated across cycles (stats host_staging_bytes.all.current; bounded by
 * the config's sleep_staging_max; cma_release_sleep_staging gives it back);
 * 2 keeps only those marked with cma_set_keep and discards the rest; 0
 * migrates kept pages to the host instead of staging them (slower; their
 * contents stay readable from the host while asleep). Staged contents are
 * reachable only through cma_wake or cma_move while asleep. Disposable
 * allocations are always discarded. All return the bytes handled, or -1.
 * Synchronise `stream` before relying on either. cma_release_sleep_staging
 * fails (code 9, failed precondition) while the staging holds contents. */
int cma_set_disposable(void* ptr, int disposable);
int cma_set_keep(void* ptr, int keep);
long long cma_sleep(int device, void* stream);
long long cma_sleep_level(int device, void* stream, int level);
long long cma_wake(int device, void* stream);
long long cma_release_sleep_staging(int device);
/* Advice for one allocation; preferred: -2 none, -1 host, >= 0 device. */
int cma_advise(void* ptr, int read_mostly, int preferred, const int* accessed_by,
               int n_accessed_by);
int cma_synchronize(void* stream);
/* Fails with cma_last_error_code() 9 (failed precondition) exactly when a
 * private pool context is open on some device (a capture may be under way),
 * releasing nothing; frameworks whose empty_cache is best effort ignore it. */
int cma_empty_cache(void);
/* Call before destroying `stream`: waits for its work, then its cached
 * blocks serve any stream and cma never uses the stream again (so
 * cma_empty_cache can release them). */
int cma_forget_stream(void* stream);
/* Private pools (PyTorch's MemPool and CUDA graph pools; the contract is
 * CachingManagedAllocator's, allocator/caching_managed_allocator.h). A pool
 * is named by two numbers. While a pool context is open, an allocation on a
 * stream for which `filter(ctx, stream)` returns non-zero (every stream if
 * `filter` is NULL) goes to the pool; `release_ctx(ctx)`, if not NULL, is
 * called exactly once: by cma_pool_end after the context has ended, by
 * cma_pool_begin(_flags) when it fails, or by cma_shutdown for a context
 * still open. While any context of a device is open, cma makes no call that
 * would break a CUDA graph capture there.
 * What the callbacks may call: `filter` runs inside cma_malloc (on the
 * allocating thread) while cma holds the device's lock, so it must call no
 * cma_* function and wait for no thread that does. `release_ctx` runs after
 * cma's locks are released and may call any cma_* function (cma_free of the
 * pool's allocations included), except when cma_shutdown calls it: then it
 * must call none. */
typedef int (*cma_stream_filter_fn)(void* ctx, void* stream);
int cma_pool_create_or_incref(int device, unsigned long long id0, unsigned long long id1);
/* Where a pool's memory comes from when it is another allocator's (PyTorch's
 * MemPool(allocator=...)): `alloc` returns `bytes` of memory of `device`
 * usable on `stream`, or NULL when out of memory; `free` gives back what
 * `alloc` returned and returns 0 (else the memory stays cached and is
 * offered again later). Both run while cma holds the device's lock: they
 * must call no cma_* function. `release_ctx`, if not NULL, is called exactly
 * once: when the pool is gone and its last segment given back (possibly
 * under cma's lock: it too must call no cma_* function), by
 * cma_pool_create_with_source when it fails, or by cma_shutdown. */
typedef struct cma_segment_source {
  void* (*alloc)(void* ctx, int device, size_t bytes, void* stream);
  int (*free)(void* ctx, int device, void* ptr, size_t bytes);
  void (*release_ctx)(void* ctx);
  void* ctx;
} cma_segment_source;
/* A new pool with one reference whose segments come from `source` (copied);
 * from then on it is a pool like any other (cma_pool_begin, _release,
 * _set_options, _empty_cache, checkpoints, statistics and snapshots). Its
 * memory is not managed memory: cma never advises, prefetches, discards or
 * moves it (cma_move and cma_advise refuse it; a Sleep leaves it alone).
 * 0, or -1 (cma_last_error) for a bad device, a NULL source or callback, or
 * a pool that exists already. */
int cma_pool_create_with_source(int device, unsigned long long id0, unsigned long long id1,
                                const cma_segment_source* source);
int cma_pool_begin(int device, unsigned long long id0, unsigned long long id1,
                   cma_stream_filter_fn filter, void* ctx, void (*release_ctx)(void* ctx));
/* cma_pool_begin with flags: CMA_POOL_REUSE_AFTER_JOIN is PyTorch's
 * graph_capture_record_stream_reuse (a block freed during a CUDA graph
 * capture while other streams used it serves the pool again inside the
 * capture once the allocating stream's captured work depends on every use).
 * Unknown flags: -1, nothing begun, ctx released. */
#define CMA_POOL_REUSE_AFTER_JOIN 1u
/* CMA_POOL_NOT_A_CAPTURE: the caller knows no CUDA graph is captured through
 * this context (PyTorch's use_mem_pool begun on a stream that is not
 * capturing; a capture begins a context of its own). cma stays active while
 * it is open (it populates, prefetches, discards and releases), and a pool
 * only such contexts allocate to grows, in arena mode, by arenas of its own
 * whose idle pages are given back as the shared cache's are. */
#define CMA_POOL_NOT_A_CAPTURE 2u
int cma_pool_begin_flags(int device, unsigned long long id0, unsigned long long id1,
                         cma_stream_filter_fn filter, void* ctx, void (*release_ctx)(void* ctx),
                         unsigned flags);
int cma_pool_end(int device, unsigned long long id0, unsigned long long id1);
/* 1 while any pool context of `device` that may be a capture is open (one
 * begun without CMA_POOL_NOT_A_CAPTURE: cma then makes no call that would
 * break a CUDA graph capture: no population, event or release), 0 when none
 * is, -1 for a bad device. A diagnostic: an open context nobody ends
 * leaves cma in that mode. */
int cma_allocating_to_pool(int device);
int cma_pool_release(int device, unsigned long long id0, unsigned long long id1);
/* 1 when the pool's live allocations are exactly ptrs[0..n), 0 when not, -1 on error. */
int cma_pool_check_live(int device, unsigned long long id0, unsigned long long id1,
                        void* const* ptrs, size_t n);
/* References on a pool (MemPool objects plus open contexts not yet
 * released), or -1 (unknown pool: error). */
int cma_pool_use_count(int device, unsigned long long id0, unsigned long long id1);
/* PyTorch's MemPool(no_split=, use_on_oom=) (allocator/mempool.h PoolOptions)
 * for a pool that holds a reference: each flag 1 (on), 0 (off) or -1 (as it
 * is). no_split: blocks handed out whole, each a segment of its own; use_on_oom:
 * the pool's free blocks serve other allocations of the device that run out
 * of memory. 0, or -1 (cma_last_error) changing nothing. */
int cma_pool_set_options(int device, unsigned long long id0, unsigned long long id1, int no_split,
                         int use_on_oom);
/* Frees the pool's idle (free, cached) blocks as cma_empty_cache does for the
 * shared cache, with PyTorch's emptyCache(mempool_id) rule: only once the
 * pool holds no reference (released, with allocations still live); a pool
 * with references keeps its blocks (a CUDA graph may replay into them), and
 * an unknown pool (never made, or its segments all given back) has none;
 * both return 0. A released pool drains: its segments serve no one until
 * this, cma_empty_cache or an out-of-memory retry gives them back. Refused
 * (-1) while a pool context of the device is open, and for a bad device. */
int cma_pool_empty_cache(int device, unsigned long long id0, unsigned long long id1);
/* torch.compile's cudagraph trees: a pool's state, taken and later restored.
 * A checkpoint is a copy of the pool's live allocations (address, size,
 * requested size, stream); NULL on error (unknown pool, bad device, or a
 * pool holding no reference, as PyTorch refuses a freeable pool). Free it
 * with cma_pool_checkpoint_free (NULL is fine). */
typedef struct cma_pool_checkpoint cma_pool_checkpoint;
cma_pool_checkpoint* cma_pool_checkpoint_take(int device, unsigned long long id0,
                                              unsigned long long id1);
void cma_pool_checkpoint_free(cma_pool_checkpoint* cp);
/* `size` is the size the allocation was requested with (cma_malloc's). */
typedef void (*cma_pool_ptr_fn)(void* ctx, void* ptr, size_t size);
/* Makes the pool's live allocations exactly the checkpoint's. As in PyTorch,
 * every allocation live in the pool now is reported to on_freed (its owner
 * must not free it; one live now and identical (address, size) in the
 * checkpoint stays in place physically but is still reported) and every
 * allocation of the checkpoint is reported to on_created (live now, at its
 * recorded address, size and stream; the caller takes ownership, i.e. frees
 * it with cma_free). All on_freed calls come first, each list by address;
 * either callback may be NULL. Callbacks run after cma's locks are
 * released. No data moves: the memory holds what was last written there.
 * On any error (the pool changed so that an allocation of the checkpoint
 * cannot be re-created at its address, unknown pool, a pool holding no
 * reference, context open, NULL checkpoint) returns -1 and changes nothing. */
int cma_pool_checkpoint_restore(const cma_pool_checkpoint* cp, cma_pool_ptr_fn on_freed,
                                cma_pool_ptr_fn on_created, void* ctx);
/* Peaks back to current values, for one device or all (-1: the host pool's
 * too). */
int cma_reset_peak_stats(int device);
/* The most device bytes in live pages at once on `device` since the last
 * call (or since the allocator began), and a new window from now; apart
 * from cma_reset_peak_stats. -1 for a bad device (cma_last_error). */
long long cma_take_live_peak(int device);
/* Resets the accumulated counters (each stat's allocated/freed and
 * num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc,
 * num_device_free, and cma's own event counters) as
 * torch.cuda.reset_accumulated_memory_stats does; current and peak values
 * stay. device -1: all. */
int cma_reset_accumulated_stats(int device);
/* The allocation's owning device; -1 for a host-pool allocation (device -1);
 * -2, with cma_last_error, for a pointer cma did not allocate. */
int cma_device_of(void* ptr);
/* The bytes requested for the allocation that starts at `ptr`; 0 (and
 * cma_last_error) when `ptr` does not start one. */
size_t cma_allocation_size(void* ptr);
/* Caps a device's managed memory at `fraction` of its total memory. */
int cma_set_memory_fraction(double fraction, int device);
/* Applies the keys cma shares with PyTorch (max_split_size_mb,
 * roundup_power2_divisions, garbage_collection_threshold) of a PyTorch
 * allocator settings string, as PYTORCH_CUDA_ALLOC_CONF or
 * torch.cuda.memory._set_allocator_settings give it, to every device from its
 * next allocation on. A shared key the string does not name takes
 * CMA_ALLOC_CONF's value again; other keys are ignored. -1 (cma_last_error
 * names the key) for a bad value, and nothing changes. Given before the
 * allocator exists, the string is checked and kept for it (this call does not
 * create it); cma_shutdown forgets it. */
int cma_apply_pytorch_settings(const char* settings);
/* Oversubscription (CMA_ALLOC_CONF oversubscribe:1): while routing is on for
 * `device` (on = 1 nests, on = 0 undoes one), its allocations live on the
 * host, read and written by the GPU over the link, as those that do not fit
 * the device's part of the budget do. 0 on success; -1 (cma_last_error)
 * without oversubscription, for a bad device, or to undo what is not on. */
int cma_set_host_routing(int device, int on);
/* An iteration of a repeating workload (a training step) ends on `device`.
 * Oversubscription with host_plan:1: the one recorded since the last call
 * plans which of the next one's allocations live on the host. learn_step:1:
 * the step learnt since the last call plans which live allocations go away
 * to the host and come back, and when, in the steps that repeat it.
 * 0; -1 for a bad device. */
int cma_mark_iteration(int device);
/* learn_step:1: work queued next on `stream` uses the `n` allocations at
 * `ptrs` (allocation starts of `device`; others are ignored). The step's
 * clock, with its allocations and frees; that work waits for their bring
 * back if one is under way. -1 (cma_last_error) without learn_step:1, for
 * a bad device or stream, n < 0 or null ptrs. */
int cma_note_uses(int device, void* const* ptrs, int n, void* stream);
/* 1 if the allocation at `ptr` lives on the host (oversubscription, or a
 * host-pool allocation not moved to a device), 0 if on its device, -1
 * (cma_last_error) if cma did not make it. */
int cma_placed_on_host(void* ptr);

/* Statistics with PyTorch's keys, {"key": value, ...}; device -1 sums all. */
char* cma_stats_json(int device);
/* The host pool's statistics: {"allocated_bytes.current", "reserved_bytes.peak",
 * "moves", "moved_bytes_to_device", "device_resident_bytes.current", ...}. */
char* cma_host_stats_json(void);
/* The last failure that num_placement_errors counted on `device` (a hint
 * the driver refused, a sleep's copies into the staging that fell back to
 * migrating, ...): its message, "" if none; NULL for a bad device. Free
 * with cma_string_free. */
char* cma_last_placement_error(int device);
/* The configuration: {"config": CMA_ALLOC_CONF text of the keys that
 * differ from the defaults, as the allocator was made, "learn_step": bool,
 * "oversubscribe": bool, "live": what it follows now, PyTorch's settings of
 * the shared keys applied since included: {"config": text, "max_split_size":
 * bytes (SIZE_MAX: any block may be split), "roundup_power2_divisions":
 * text, "roundup_power2_divisions_by_interval": [16 counts, as
 * cma_live_settings_info], "garbage_collection_threshold": fraction (0:
 * off), "segments": "arena"|"classic", "pytorch_settings": the last string
 * cma_apply_pytorch_settings accepted ("" if none)}}. Free with
 * cma_string_free; NULL (cma_last_error) when the allocator cannot be made. */
char* cma_config_json(void);
/* The host pool's live allocations (device -1: CPU-side memory), by address:
 * [{"address", "size", "requested_size", "state" ("active_allocated", or
 * "active_pending_free": freed, awaiting a GPU's work), "stream",
 * "location" (where the last move left the pages: "host" or "device N")}].
 * cma_snapshot_json has the devices' segments only. */
char* cma_host_snapshot_json(void);
/* [{"device", "address", "total_size", "segment_type", "is_arena",
 *   "populated_bytes", "on_host", "blocks": [...]}, ...] (an arena's
 *   total_size is its address range; populated_bytes its memory; on_host:
 *   oversubscription's host tier, whose pages live on the host and count in
 *   no device number). Each block: {"address", "size", "requested_size",
 *   "state", "stream", "location", "away" (a live allocation sent to the
 *   host, cma_send_away), "pool": [id0, id1]} ([0, 0]: the shared cache). */
char* cma_snapshot_json(void);
void cma_string_free(char* s);
/* Allocation history for tools: while enabled, the last max_entries alloc
 * and free events of cma_malloc/cma_free (and the PyTorch entry points).
 * Disabling clears it. cma_history_json: [{"action", "addr", "size",
 * "device", "stream", "time_us"}, ...], oldest first. */
int cma_record_history(int enabled, int max_entries);
char* cma_history_json(void);

/* ---- introspection for frameworks' allocator interfaces (PyTorch's c10
 * CUDAAllocator: getDeviceStats, snapshot) ---- */
typedef struct cma_stat_pair {
  const char* key; /* cma_stats_json's keys: "allocated_bytes.all.current", ... */
  long long value;
} cma_stat_pair;
/* The managed statistics of `device` (-1: all devices) as key/value pairs:
 * writes min(count, cap) pairs to `out` and returns count (call with cap 0 to
 * size the array), or -1. The keys stay valid until this thread's next call
 * of cma_stats_pairs. */
long long cma_stats_pairs(int device, cma_stat_pair* out, size_t cap);

/* The settings cma follows now (CMA_ALLOC_CONF's, with the keys shared
 * with PyTorch as the last cma_apply_pytorch_settings left them), for a
 * framework's allocator interface (PyTorch's getDeviceStats().max_split_size
 * and a snapshot's config_metadata). */
#define CMA_ROUNDUP_INTERVALS 16
typedef struct cma_live_settings_info {
  size_t max_split_size;               /* SIZE_MAX: any block may be split */
  double garbage_collection_threshold; /* 0: off */
  /* roundup_power2_divisions per size interval, as PyTorch's config lists
   * them: [0, 2 MiB), [2 MiB, 4 MiB), ..., [32 GiB, inf); 0: none. */
  size_t roundup_power2_divisions[CMA_ROUNDUP_INTERVALS];
  int is_arena; /* segments:arena: address space populated on demand */
  /* The last string cma_apply_pytorch_settings accepted ("" if none); valid
   * until this thread's next cma_live_settings. */
  const char* pytorch_settings;
} cma_live_settings_info;
/* 0, or -1 (cma_last_error): the allocator cannot be made, or out is NULL. */
int cma_live_settings(cma_live_settings_info* out);

typedef struct cma_segment_info {
  int device;
  int is_large; /* large-block segment (not the small-block pool's) */
  int is_arena; /* an arena: address space populated on demand */
  size_t address;
  size_t total_size; /* the sum of its blocks' sizes; an arena (address space)
                      * is reported up to its last block in use or its last
                      * populated page, rounded up to a page: free blocks over
                      * populated pages stay in view until cma_empty_cache */
  size_t allocated_size;
  size_t requested_size;
  size_t populated_bytes;
  size_t n_blocks;
} cma_segment_info;
typedef struct cma_block_info {
  size_t address;
  size_t size;
  size_t requested_size;
  int allocated; /* handed to a caller */
  int active;    /* allocated, or freed and still awaiting another stream */
  void* stream;
  unsigned long long pool0, pool1; /* owning private pool; 0, 0: the shared cache */
  int own_segment; /* a no_split pool's block: a segment by itself */
} cma_block_info;
/* Visits a consistent copy of every segment: on_segment(ctx, segment), then
 * on_block(ctx, block) for each of its n_blocks blocks in address order.
 * Callbacks run with no cma lock held and may call cma. 0, or -1. */
int cma_snapshot_visit(void (*on_segment)(void* ctx, const cma_segment_info* segment),
                       void (*on_block)(void* ctx, const cma_block_info* block), void* ctx);


/* ---- symmetric memory (allocator/symmetric/symmetric_heap.h) ----
 * A heap serves `n_local` members of a group of `world_size` (rank
 * local_ranks[i] on device local_devices[i]) in this process, which is
 * process `process_index` of `process_count`. With several processes,
 * `allgather` (a framework's all-gather of fixed-size byte buffers: send's
 * len bytes from every process land in recv in process order; 0 on success)
 * bootstraps the authenticated Unix-socket rendezvous once; NULL when every
 * member is in this process. `timeout_seconds` bounds the rendezvous and
 * every collective: in (0, 86400]; infinite, NaN, larger or non-positive
 * values are refused (NULL, cma_last_error says why), because every wait
 * must end in an error naming a dead member rather than a hang.
 * `options`: "signal_bytes:N,multicast:0|1,non_dumpable:0|1,
 * handles:fd|fabric|fabric_or_fd"; non_dumpable:1 makes the process
 * non-dumpable while the heap holds memory, so that other processes of this
 * user cannot read the buffers through /proc/PID/mem
 * (SymmetricOptions::non_dumpable says more); handles:fabric exports fabric
 * handles (multi-node NVLink), probed at create (NULL, cma_last_error naming
 * the device, when one cannot), and fabric_or_fd falls back to POSIX FDs
 * there (SymmetricOptions::handle_type); provider:nvshmem takes the memory
 * from NVSHMEM's symmetric heap instead of VMM handles (one member per
 * process, member r in process r; NVSHMEM's host library is loaded at run
 * time: CMA_NVSHMEM_LIBRARY, else libnvshmem_host.so.3; create then fails
 * with UNAVAILABLE naming it when absent; docs/symmetric.md, "NVSHMEM").
 * Allocation, free and empty_cache are collective (same order everywhere).
 * Memory comes from the process-wide backend (cma_init / CMA_BACKEND).
 * A cma_symmetric_allocation* is an opaque handle, not an address: a number
 * this process never hands out twice. Once freed (or its heap destroyed),
 * every call refuses it (-1 or NULL; cma_last_error says why) without
 * touching the allocation, even when a later alloc reuses the same memory;
 * a refused free changes nothing.
 * Fail together: with several processes, every process's verdict on its
 * own arguments (world_size, ranks out of range or repeated, devices,
 * timeout, options) is gathered through `allgather` before the rendezvous,
 * and every check of the heap's creation (devices, options the members
 * must share: world size, provider, signal_bytes) joins a round after it:
 * bad input on one process makes create return NULL on every process at
 * once, its own error on that process and "process P refused its own
 * arguments (...)" (or "process P failed this collective: ...") on the
 * others. non_dumpable:1 on any process applies to every process of the
 * group (each maps the others' memory). */
typedef struct cma_symmetric_heap cma_symmetric_heap;
typedef struct cma_symmetric_allocation cma_symmetric_allocation;
typedef int (*cma_allgather_fn)(void* ctx, const void* send, size_t len, void* recv);

cma_symmetric_heap* cma_symmetric_create(int world_size, const int* local_ranks,
                                         const int* local_devices, int n_local,
                                         int process_index, int process_count,
                                         cma_allgather_fn allgather, void* ctx,
                                         double timeout_seconds, const char* options);
/* Across hosts (allocator/symmetric/multi_host.h; docs/symmetric.md,
 * "Across hosts"): the same heap over a group whose processes are on
 * several hosts. Collective over every process of the group; same
 * arguments as cma_symmetric_create, plus:
 * - `host_id`: this process's host (1 to 64 bytes; the same string on every
 *   process of a host, a different one on each host; e.g. the hostname or
 *   torch's LOCAL_WORLD group). The ids are gathered through `allgather`
 *   (every process; used at set-up only, like cma_symmetric_create's).
 *   Hosts are numbered in the order of their first process, and each host's
 *   first process is its leader.
 * - `token`: the launcher's rendezvous token, the same on every process (32
 *   to 128 hex digits passing the token rule of exchange.h; e.g. Python's
 *   secrets.token_hex(32)); it is the whole proof of membership across hosts
 *   and never crosses the wire. It must not come through the framework's
 *   unauthenticated store.
 * - `leaders_allgather`/`leaders_ctx`: an all-gather among the leaders only
 *   (host order: the leaders by process index), called on leaders only, for
 *   every leaders' round of the set-up and of each collective: e.g. a
 *   torch.distributed group of the leaders. Needed on every leader when
 *   there are several hosts; may be NULL elsewhere.
 * Each host's processes rendezvous as on one host (their own Unix socket
 * and token, bootstrapped through `allgather`); the leaders prove the token
 * to each other and MAC every later round. `timeout_seconds` bounds every
 * host round; the leaders' callback must bound its own waits.
 * Errors (NULL; cma_last_error says why; on every process together where
 * the set-up reached the gather): a null allgather or bad process index or
 * count at once; bad local arguments (world_size, ranks, timeout, host_id,
 * token, options) on the process that passed them, and on every other
 * "process P refused its own arguments"; a leader without leaders_allgather;
 * a failed callback (UNAVAILABLE); a leader with a different token
 * ("did not prove that it knows the rendezvous token", PERMISSION_DENIED).
 * Members on another host outside this process's NVLink domain (or with
 * handles:fd) get no pointer: cma_symmetric_peer and cma_symmetric_signal
 * return NULL for them without an error (cma_symmetric_unreachable_json
 * says which and why), device_peers holds NULL there, and the allocation
 * is still collective and cached as usual. Ownership: `allgather` is used
 * during this call only; `leaders_allgather` and `leaders_ctx` are kept by
 * the heap and called on leaders in every alloc, free and empty_cache, so
 * they must stay valid until cma_symmetric_destroy. Thread safety: any thread, as every cma_* function; the
 * heap's collectives (alloc, free, empty_cache), like the create, are made in
 * the same order on every process, one at a time per heap. */
cma_symmetric_heap* cma_symmetric_create_multi_host(
    int world_size, const int* local_ranks, const int* local_devices, int n_local,
    int process_index, int process_count, const char* host_id, const char* token,
    cma_allgather_fn allgather, void* ctx, cma_allgather_fn leaders_allgather, void* leaders_ctx,
    double timeout_seconds, const char* options);
/* {"ranks": [members with no pointer here], "reason": "" or why}; NULL for a
 * dead handle. Release with cma_string_free. */
char* cma_symmetric_unreachable_json(const cma_symmetric_allocation* a);
/* Releases what this process mapped or created (not collective). */
void cma_symmetric_destroy(cma_symmetric_heap* heap);
/* make_symmetric: members may ask for different sizes; all get the largest. */
cma_symmetric_allocation* cma_symmetric_alloc(cma_symmetric_heap* heap, size_t size,
                                              int make_symmetric);
int cma_symmetric_free(cma_symmetric_heap* heap, cma_symmetric_allocation* a);
int cma_symmetric_empty_cache(cma_symmetric_heap* heap);
size_t cma_symmetric_size(const cma_symmetric_allocation* a);
/* Member `rank`'s buffer and signal area as mapped in this process; NULL for
 * a bad rank (an error set), or, with no error, for a member with no
 * pointer here (across hosts: cma_symmetric_unreachable_json). */
void* cma_symmetric_peer(const cma_symmetric_allocation* a, int rank);
void* cma_symmetric_signal(const cma_symmetric_allocation* a, int rank);
size_t cma_symmetric_signal_size(const cma_symmetric_heap* heap);
/* Not collective: copies `bytes` from local device (or host) memory `src`
 * into member `rank`'s buffer at byte `offset` (put), or from there into
 * `dst` (get), in the order of `stream` (a cudaStream_t; NULL: the default
 * stream): a direct copy when that member is mapped here
 * (cma_symmetric_peer is not NULL), NVSHMEM's put/get otherwise (the
 * nvshmem provider). 0, or -1 with cma_last_error naming the problem and
 * nothing copied: a dead handle, a bad rank, [offset, offset + bytes) past
 * cma_symmetric_size, a NULL pointer, or an unmapped member of a VMM heap
 * (UNAVAILABLE). Thread safety: any thread; it waits while another thread
 * is in one of the heap's collectives. */
int cma_symmetric_put(const cma_symmetric_allocation* a, int rank, size_t offset,
                      const void* src, size_t bytes, void* stream);
int cma_symmetric_get(const cma_symmetric_allocation* a, int rank, size_t offset, void* dst,
                      size_t bytes, void* stream);
/* world_size pointers (void*[]) that kernels can read. */
void* cma_symmetric_device_peers(const cma_symmetric_allocation* a);
/* NCCL windows (SymmetricHeap::RegisterWindow): collective. Registers this
 * process's buffer of `a` (its whole stride, signal area included) as a
 * symmetric window of `nccl_comm`, an ncclComm_t of the NCCL already loaded
 * in this process (NCCL 2.27+; torch: ProcessGroupNCCL's _comm_ptr()) whose
 * rank, size and device are this heap's member's (one member per process),
 * so that NCCL's symmetric collectives run on the buffer. *window (when
 * `window` is not NULL) gets the ncclWindow_t. Cached with the allocation: registering it again, also
 * after a free and a cache hit, makes one exchange and no NCCL call. The
 * window is deregistered when the allocation's memory goes
 * (cma_symmetric_empty_cache, cma_symmetric_destroy), or by
 * cma_symmetric_release_nccl_windows, which every member must call before
 * the communicator is destroyed. Returns 0, or -1 (cma_last_error) on every
 * member together: a bad handle or communicator on one member fails all of
 * them before NCCL is called, and a failure inside NCCL is undone on all. */
int cma_symmetric_register_nccl_window(cma_symmetric_heap* heap,
                                       const cma_symmetric_allocation* a, void* nccl_comm,
                                       void** window);
/* Collective: deregisters every window on `nccl_comm` (of live and cached
 * allocations); returns how many this process released, or -1. */
int cma_symmetric_release_nccl_windows(cma_symmetric_heap* heap, void* nccl_comm);
/* Host backend only (CI's stand-in for NCCL): a communicator as NCCL's
 * would be for member `rank` of `size` on `device`, for the two calls
 * above; NULL (cma_last_error) on a backend with real communicators. */
void* cma_host_emulated_comm(int rank, int size, int device);
/* {"allocations", "cache_hits", "exchanges", "symmetric_bytes", ..., "windows"} */
char* cma_symmetric_stats_json(cma_symmetric_heap* heap);
/* Every heap's allocations: [{"id", "bytes", "stride", "state" (allocated |
 * cached), "local_devices", "peers"}, ...] */
char* cma_symmetric_snapshot_json(void);

#ifdef __cplusplus
}
#endif

#endif /* CMA_INTEGRATIONS_C_CMA_C_H_ */
