/* cma_c.h: the C ABI of caching_managed_allocator, for frameworks (PyTorch's
 * CUDAPluggableAllocator and MemPool, CuPy, anything with ctypes).
 *
 * One process-wide allocator. cma_init creates it (later calls with the same
 * arguments are no-ops; different ones fail); the cma_torch_* entry points
 * create it on first use from CMA_ALLOC_CONF and CMA_BACKEND.
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

void* cma_malloc(size_t size, int device, void* stream);
int cma_free(void* ptr);
int cma_record_stream(void* ptr, void* stream);
/* Zero-copy move of an allocation to `location`, ordered on `stream`.
 * The host must cma_synchronize(stream) before touching data moved to it. */
int cma_move(void* ptr, int location, void* stream, int contents_dead);
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
 * called once the context has ended. While any context of a device is
 * open, cma makes no call that would break a CUDA graph capture there. */
typedef int (*cma_stream_filter_fn)(void* ctx, void* stream);
int cma_pool_create_or_incref(int device, unsigned long long id0, unsigned long long id1);
int cma_pool_begin(int device, unsigned long long id0, unsigned long long id1,
                   cma_stream_filter_fn filter, void* ctx, void (*release_ctx)(void* ctx));
int cma_pool_end(int device, unsigned long long id0, unsigned long long id1);
int cma_pool_release(int device, unsigned long long id0, unsigned long long id1);
/* 1 when the pool's live allocations are exactly ptrs[0..n), 0 when not, -1 on error. */
int cma_pool_check_live(int device, unsigned long long id0, unsigned long long id1,
                        void* const* ptrs, size_t n);
/* Peaks back to current values, for one device or all (-1). */
int cma_reset_peak_stats(int device);
/* The allocation's owning device, or -1 (with cma_last_error) if none. */
int cma_device_of(void* ptr);
/* The bytes requested for the allocation that starts at `ptr`; 0 (and
 * cma_last_error) when `ptr` does not start one. */
size_t cma_allocation_size(void* ptr);
/* Caps a device's managed memory at `fraction` of its total memory. */
int cma_set_memory_fraction(double fraction, int device);

/* Statistics with PyTorch's keys, {"key": value, ...}; device -1 sums all. */
char* cma_stats_json(int device);
/* [{"device", "address", "total_size", "segment_type", "is_arena",
 *   "populated_bytes", "blocks": [...]}, ...] (an arena's total_size is its
 *   address range; populated_bytes its memory) */
char* cma_snapshot_json(void);
void cma_string_free(char* s);
/* Allocation history for tools: while enabled, the last max_entries alloc
 * and free events of cma_malloc/cma_free (and the PyTorch entry points).
 * Disabling clears it. cma_history_json: [{"action", "addr", "size",
 * "device", "stream", "time_us"}, ...], oldest first. */
int cma_record_history(int enabled, int max_entries);
char* cma_history_json(void);

/* torch.cuda.memory.CUDAPluggableAllocator entry points. */
void* cma_torch_alloc(size_t size, int device, void* stream);
void cma_torch_free(void* ptr, size_t size, int device, void* stream);
void cma_torch_init(int device_count);
void cma_torch_reset(void);
void cma_torch_memory_fraction(double fraction, int device);
void cma_torch_record_stream(void* ptr, void* stream);

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
 * `options`: "signal_bytes:N,multicast:0|1".
 * Allocation, free and empty_cache are collective (same order everywhere).
 * Memory comes from the process-wide backend (cma_init / CMA_BACKEND). */
typedef struct cma_symmetric_heap cma_symmetric_heap;
typedef struct cma_symmetric_allocation cma_symmetric_allocation;
typedef int (*cma_allgather_fn)(void* ctx, const void* send, size_t len, void* recv);

cma_symmetric_heap* cma_symmetric_create(int world_size, const int* local_ranks,
                                         const int* local_devices, int n_local,
                                         int process_index, int process_count,
                                         cma_allgather_fn allgather, void* ctx,
                                         double timeout_seconds, const char* options);
/* Releases what this process mapped or created (not collective). */
void cma_symmetric_destroy(cma_symmetric_heap* heap);
/* make_symmetric: members may ask for different sizes; all get the largest. */
cma_symmetric_allocation* cma_symmetric_alloc(cma_symmetric_heap* heap, size_t size,
                                              int make_symmetric);
int cma_symmetric_free(cma_symmetric_heap* heap, cma_symmetric_allocation* a);
int cma_symmetric_empty_cache(cma_symmetric_heap* heap);
size_t cma_symmetric_size(const cma_symmetric_allocation* a);
/* Member `rank`'s buffer and signal area as mapped in this process; NULL for
 * a bad rank. */
void* cma_symmetric_peer(const cma_symmetric_allocation* a, int rank);
void* cma_symmetric_signal(const cma_symmetric_allocation* a, int rank);
size_t cma_symmetric_signal_size(const cma_symmetric_heap* heap);
/* world_size pointers (void*[]) that kernels can read. */
void* cma_symmetric_device_peers(const cma_symmetric_allocation* a);
/* {"allocations", "cache_hits", "exchanges", "symmetric_bytes", ...} */
char* cma_symmetric_stats_json(cma_symmetric_heap* heap);
/* Every heap's allocations: [{"id", "bytes", "stride", "state" (allocated |
 * cached), "local_devices", "peers"}, ...] */
char* cma_symmetric_snapshot_json(void);

#ifdef __cplusplus
}
#endif

#endif /* CMA_INTEGRATIONS_C_CMA_C_H_ */
