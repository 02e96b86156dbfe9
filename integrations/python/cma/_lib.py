"""ctypes binding of libcma.so (integrations/c/cma_c.h).

The library is $CMA_LIBRARY when that is set (a path that does not exist is
an error, never a silent fallback); otherwise the first found of: beside this
package (an installed wheel ships it there, with the shared libraries it needs),
a Bazel test's runfiles, the repository's bazel-bin. Every failure raises
CmaError carrying the library's own message; an out-of-memory raises
CmaOutOfMemoryError, which is also a MemoryError.
"""
import ctypes
import json
import os
import threading

_lock = threading.Lock()
_lib = None


class CmaError(RuntimeError):
    """A call into libcma failed; the message is cma_last_error()."""


class CmaOutOfMemoryError(CmaError, MemoryError):
    """cma could not find the memory (cma_last_error_code() 8, resource
    exhausted); a MemoryError too, so frameworks' out-of-memory handling sees it."""


_RESOURCE_EXHAUSTED = 8  # absl::StatusCode, as cma_last_error_code() reports it


def library_path():
    here = os.path.dirname(os.path.abspath(__file__))
    override = os.environ.get("CMA_LIBRARY", "")
    if override:
        if not os.path.exists(override):
            raise CmaError(f"CMA_LIBRARY={override} does not exist; unset it to use the "
                           "libcma.so inside the cma package")
        return os.path.abspath(override)
    candidates = [os.path.join(here, "libcma.so")]
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        candidates.append(os.path.join(srcdir, "cma", "integrations", "c", "libcma.so"))
    candidates.append(os.path.join(here, "..", "..", "..", "bazel-bin", "integrations", "c",
                                   "libcma.so"))
    for c in candidates:
        if c and os.path.exists(c):
            return os.path.abspath(c)
    raise CmaError("libcma.so not found; build it with ./bazelw build -c opt "
                   "//integrations/c:libcma.so or set CMA_LIBRARY")


def lib():
    global _lib
    with _lock:
        if _lib is None:
            l = ctypes.CDLL(library_path())
            vp, i, sz, cp = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p
            sig = {
                "cma_init": (i, [cp, cp]),
                "cma_shutdown": (None, []),
                "cma_backend_name": (cp, []),
                "cma_device_count": (i, []),
                "cma_mem_info": (i, [i, ctypes.POINTER(sz), ctypes.POINTER(sz)]),
                "cma_last_error": (cp, []),
                "cma_last_error_code": (i, []),
                "cma_malloc": (vp, [sz, i, vp]),
                "cma_free": (i, [vp]),
                "cma_record_stream": (i, [vp, vp]),
                "cma_move": (i, [vp, i, vp, i]),
                "cma_advise": (i, [vp, i, i, ctypes.POINTER(i), i]),
                "cma_synchronize": (i, [vp]),
                "cma_empty_cache": (i, []),
                "cma_forget_stream": (i, [vp]),
                "cma_reset_peak_stats": (i, [i]),
                "cma_take_live_peak": (ctypes.c_longlong, [i]),
                "cma_device_of": (i, [vp]),
                "cma_allocation_size": (sz, [vp]),
                "cma_set_memory_fraction": (i, [ctypes.c_double, i]),
                "cma_apply_pytorch_settings": (i, [ctypes.c_char_p]),
                "cma_set_host_routing": (i, [i, i]),
                "cma_placed_on_host": (i, [vp]),
                "cma_mark_iteration": (i, [i]),
                "cma_note_uses": (i, [i, ctypes.POINTER(vp), i, vp]),
                "cma_send_away": (i, [ctypes.POINTER(vp), i, vp]),
                "cma_bring_back": (i, [ctypes.POINTER(vp), i, vp]),
                "cma_stats_json": (vp, [i]),
                "cma_host_stats_json": (vp, []),
                "cma_last_placement_error": (vp, [i]),
                "cma_snapshot_json": (vp, []),
                "cma_host_snapshot_json": (vp, []),
                "cma_config_json": (vp, []),
                "cma_string_free": (None, [vp]),
                "cma_symmetric_create": (vp, [i, ctypes.POINTER(i), ctypes.POINTER(i), i, i, i,
                                              vp, vp, ctypes.c_double, cp]),
                "cma_symmetric_create_multi_host": (vp, [i, ctypes.POINTER(i),
                                                         ctypes.POINTER(i), i, i, i, cp, cp,
                                                         vp, vp, vp, vp, ctypes.c_double,
                                                         cp]),
                "cma_symmetric_unreachable_json": (vp, [vp]),
                "cma_symmetric_destroy": (None, [vp]),
                "cma_record_history": (i, [i, i]),
                "cma_set_disposable": (i, [vp, i]),
                "cma_sleep": (ctypes.c_longlong, [i, vp]),
                "cma_sleep_level": (ctypes.c_longlong, [i, vp, i]),
                "cma_set_keep": (i, [vp, i]),
                "cma_release_sleep_staging": (ctypes.c_longlong, [i]),
                "cma_wake": (ctypes.c_longlong, [i, vp]),
                "cma_history_json": (vp, []),
                "cma_symmetric_alloc": (vp, [vp, sz, i]),
                "cma_symmetric_free": (i, [vp, vp]),
                "cma_symmetric_empty_cache": (i, [vp]),
                "cma_symmetric_size": (sz, [vp]),
                "cma_symmetric_peer": (vp, [vp, i]),
                "cma_symmetric_signal": (vp, [vp, i]),
                "cma_symmetric_signal_size": (sz, [vp]),
                "cma_symmetric_put": (i, [vp, i, sz, vp, sz, vp]),
                "cma_symmetric_get": (i, [vp, i, sz, vp, sz, vp]),
                "cma_symmetric_device_peers": (vp, [vp]),
                "cma_symmetric_stats_json": (vp, [vp]),
                "cma_symmetric_register_nccl_window": (i, [vp, vp, vp, ctypes.POINTER(vp)]),
                "cma_symmetric_release_nccl_windows": (i, [vp, vp]),
                "cma_host_emulated_comm": (vp, [i, i, i]),
                "cma_symmetric_snapshot_json": (vp, []),
            }
            for name, (res, args) in sig.items():
                f = getattr(l, name)
                f.restype, f.argtypes = res, args
            _lib = l
    return _lib


def _error():
    message = lib().cma_last_error().decode()
    if lib().cma_last_error_code() == _RESOURCE_EXHAUSTED:
        return CmaOutOfMemoryError(message)
    return CmaError(message)


def _check(rc):
    if rc != 0:
        raise _error()


def _json(ptr):
    if not ptr:
        raise _error()
    try:
        return json.loads(ctypes.string_at(ptr).decode())
    finally:
        lib().cma_string_free(ptr)


def _location(location):
    if location in ("cpu", "host", -1):
        return -1
    if isinstance(location, int) and location >= 0:
        return location
    raise ValueError(f"location must be a device index or 'cpu', not {location!r}")


def init(config="", backend="best"):
    _check(lib().cma_init(config.encode(), backend.encode()))


def shutdown():
    """Releases every allocation and the allocator. Refused while
    cma.torch.managed_cpu() is on: PyTorch's CPU tensors live in it."""
    import sys
    managed = sys.modules.get("cma.torch.cpu_switch")
    if managed is not None and managed.is_managed_cpu():
        raise CmaError("cma.shutdown(): CPU tensors live in cma while cma.torch.managed_cpu() is "
                       "on; turn it off (and let those tensors go) first")
    lib().cma_shutdown()


def backend_name():
    name = lib().cma_backend_name()
    if name is None:
        raise _error()
    return name.decode()


def mem_info(device=0):
    """(free, total) bytes of `device` as its backend reports them (the
    driver's cudaMemGetInfo on CUDA)."""
    free_bytes, total_bytes = ctypes.c_size_t(), ctypes.c_size_t()
    _check(lib().cma_mem_info(device, ctypes.byref(free_bytes), ctypes.byref(total_bytes)))
    return free_bytes.value, total_bytes.value


def malloc(size, device=0, stream=0):
    """device "cpu" (or -1): CPU-side memory from the host pool, which
    move() takes to a GPU and back without a copy."""
    p = lib().cma_malloc(size, _location(device), stream or None)
    if not p:
        raise _error()
    return p


def free(ptr):
    _check(lib().cma_free(ptr))


def record_stream(ptr, stream):
    _check(lib().cma_record_stream(ptr, stream or None))


def move(ptr, location, stream=0, contents_dead=False):
    """Zero-copy move of the allocation at ptr; ordered on stream."""
    _check(lib().cma_move(ptr, _location(location), stream or None, int(contents_dead)))


def synchronize(stream=0):
    _check(lib().cma_synchronize(stream or None))


def advise(ptr, read_mostly=False, preferred=None, accessed_by=()):
    pref = -2 if preferred is None else _location(preferred)
    arr = (ctypes.c_int * len(accessed_by))(*accessed_by)
    _check(lib().cma_advise(ptr, int(read_mostly), pref, arr, len(accessed_by)))


def empty_cache():
    _check(lib().cma_empty_cache())


def forget_stream(stream):
    """Call before destroying `stream` (a raw stream handle): waits for its
    work, then its cached blocks serve any stream and cma never uses it again."""
    _check(lib().cma_forget_stream(stream or None))


def reset_peak_stats(device=-1):
    """Peaks back to current values, for one device or all (-1)."""
    _check(lib().cma_reset_peak_stats(device))


def take_live_peak(device=0):
    """The most bytes of live device pages at once on `device` since the
    last call, and a new window from now (apart from reset_peak_stats)."""
    r = lib().cma_take_live_peak(device)
    if r < 0:
        raise _error()
    return r


def set_memory_fraction(fraction, device=0):
    _check(lib().cma_set_memory_fraction(fraction, device))


def apply_pytorch_settings(settings):
    """The keys cma shares with PyTorch (max_split_size_mb,
    roundup_power2_divisions, garbage_collection_threshold) of a PyTorch
    allocator settings string, from the next allocation on; a shared key it
    does not name takes CMA_ALLOC_CONF's value again, other keys are ignored.
    Given before cma's allocator exists, it is checked and kept for it."""
    _check(lib().cma_apply_pytorch_settings(settings.encode()))


def set_host_routing(on, device=0):
    """Oversubscription (CMA_ALLOC_CONF oversubscribe:1): while on (calls
    nest), `device`'s allocations live on the host, read over the link."""
    _check(lib().cma_set_host_routing(device, 1 if on else 0))


def mark_iteration(device=0):
    """An iteration (a training step) ends on `device`: with host_plan:1 the
    one recorded since the last call plans the next one's host placements;
    with learn_step:1 the step learnt plans what goes away and comes back."""
    _check(lib().cma_mark_iteration(device))


def _pointer_array(ptrs):
    ptrs = list(ptrs)
    return (ctypes.c_void_p * len(ptrs))(*ptrs), len(ptrs)


def note_uses(ptrs, stream=None, device=0):
    """learn_step:1: work queued next on `stream` uses the allocations
    starting at `ptrs` (ints) on `device`; the step's clock."""
    arr, n = _pointer_array(ptrs)
    _check(lib().cma_note_uses(device, arr, n, stream))


def send_away(ptrs, stream=None):
    """The away state: the allocations starting at `ptrs` wait on the host,
    ordered on `stream`, until bring_back (same addresses, data kept)."""
    arr, n = _pointer_array(ptrs)
    _check(lib().cma_send_away(arr, n, stream))


def bring_back(ptrs, stream=None):
    """The away state: the allocations at `ptrs` return to their device."""
    arr, n = _pointer_array(ptrs)
    _check(lib().cma_bring_back(arr, n, stream))


def placed_on_host(ptr):
    """Whether the allocation at `ptr` lives on the host (oversubscription)."""
    r = lib().cma_placed_on_host(ptr)
    if r < 0:
        raise _error()
    return bool(r)


def device_of(ptr):
    """The owning device of an allocation; None for a host-pool allocation
    and for a pointer libcma did not make."""
    d = lib().cma_device_of(ptr)
    return None if d < 0 else d


def stats(device=-1):
    return _json(lib().cma_stats_json(device))


def config():
    """The configuration: {"config": text as the allocator was made,
    "learn_step": bool, "oversubscribe": bool, "live": what it follows now,
    PyTorch's settings of the shared keys included ({"config",
    "max_split_size", "roundup_power2_divisions", "garbage_collection_threshold",
    "segments", "pytorch_settings": the last string applied, ...}; cma_c.h)}."""
    return _json(lib().cma_config_json())


def host_stats():
    """The host pool's statistics (cma_c.h's cma_host_stats_json)."""
    return _json(lib().cma_host_stats_json())


def snapshot():
    return _json(lib().cma_snapshot_json())


def host_snapshot():
    """The host pool's live allocations (CPU-side memory: managed CPU
    tensors), by address: [{"address", "size", "requested_size", "state",
    "stream", "location": "host" or "device N"}]."""
    return _json(lib().cma_host_snapshot_json())


def last_placement_error(device=0):
    """The last failure num_placement_errors counted on `device` (a hint the
    driver refused, a sleep's copies that fell back to migrating): its
    message, or None."""
    ptr = lib().cma_last_placement_error(device)
    if not ptr:
        raise _error()
    try:
        return ctypes.string_at(ptr).decode() or None
    finally:
        lib().cma_string_free(ptr)


def memory_stats(device=-1):
    """Managed and symmetric memory side by side (PyTorch's keys, plus
    symmetric_bytes.current/peak, symmetric_allocations, ...); -1: all devices."""
    return stats(device)


def memory_snapshot():
    """Managed segments, the host pool's allocations and symmetric allocations:
    {"managed": [...], "host": [...], "symmetric": [...]}."""
    return {"managed": snapshot(), "host": host_snapshot(),
            "symmetric": _json(lib().cma_symmetric_snapshot_json())}


def set_disposable(ptr, disposable=True):
    """Sleep may discard this allocation's contents (until it is freed)."""
    _check(lib().cma_set_disposable(ptr, int(bool(disposable))))


def allocation_size(ptr):
    """The bytes requested for the allocation starting at `ptr`; None when
    no allocation starts there."""
    n = lib().cma_allocation_size(ptr)
    return n if n else None


def set_keep(ptr, keep=True):
    """A level-2 sleep keeps this allocation's contents (until it is freed)."""
    _check(lib().cma_set_keep(ptr, int(bool(keep))))


def sleep(device=0, stream=0, level=1):
    """Every allocation of `device` leaves it (cma_c.h's cma_sleep_level):
    level 1 stages kept contents in pinned host memory kept across cycles,
    2 keeps only those marked keep, 0 migrates; disposable ones are
    discarded. Returns the bytes. Synchronise `stream` before relying on it."""
    n = lib().cma_sleep_level(device, stream or None, int(level))
    if n < 0:
        raise _error()
    return n


def release_sleep_staging(device=0):
    """Gives `device`'s sleep staging (pinned host memory) back; returns the
    bytes. Raises while it holds a sleeping allocation's contents."""
    n = lib().cma_release_sleep_staging(device)
    if n < 0:
        raise _error()
    return n


def wake(device=0, stream=0):
    n = lib().cma_wake(device, stream or None)
    if n < 0:
        raise _error()
    return n


def record_history(enabled=True, max_entries=100_000):
    """Records alloc/free events (for snapshot device traces) while enabled."""
    _check(lib().cma_record_history(int(bool(enabled)), int(max_entries)))


def history():
    return _json(lib().cma_history_json())


class _HostBuffer:
    """Exposes managed memory to numpy without copying; keeps `owner` alive."""

    def __init__(self, ptr, nbytes, owner):
        self.owner = owner
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                    "data": (ptr, False), "version": 3}


def host_view(ptr, nbytes, owner=None):
    """A numpy uint8 array over [ptr, ptr+nbytes); the array keeps owner alive."""
    import numpy
    return numpy.asarray(_HostBuffer(ptr, nbytes, owner))
