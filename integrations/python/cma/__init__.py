"""caching_managed_allocator from Python: a thin ctypes layer over libcma.so.

    import cma
    cma.init("max_split_size_mb:256", backend="best")
    p = cma.malloc(1 << 20, device=0)
    cma.free(p)

Framework routes: cma.torch (PyTorch), cma.cupy (CuPy) and cma.numba (Numba's
External Memory Management plugin). Installed from the wheel, the package
carries libcma.so; CMA_LIBRARY, when set, names another one.
"""
from cma._lib import (CmaError, CmaOutOfMemoryError, advise, apply_pytorch_settings, backend_name, config, device_of, empty_cache, forget_stream, free, host_stats, host_view,
                      history, host_snapshot, init, last_placement_error, library_path, malloc, mem_info, memory_snapshot, memory_stats, move, placed_on_host,
                      record_history, record_stream, release_sleep_staging, set_host_routing, reset_peak_stats, set_disposable, set_keep, sleep, wake,
                      set_memory_fraction, shutdown, snapshot, stats, synchronize)

__all__ = ["CmaError", "CmaOutOfMemoryError", "advise", "apply_pytorch_settings", "backend_name", "config", "device_of", "empty_cache", "forget_stream", "free", "host_stats", "host_view",
           "history", "host_snapshot", "init", "last_placement_error", "library_path", "malloc", "mem_info", "memory_snapshot", "memory_stats", "move", "placed_on_host",
           "record_history", "record_stream", "release_sleep_staging", "set_host_routing", "reset_peak_stats", "set_disposable", "set_keep", "sleep", "wake",
           "set_memory_fraction",
           "shutdown", "snapshot", "stats", "synchronize"]
