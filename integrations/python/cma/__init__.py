"""caching_managed_allocator from Python: a thin ctypes layer over libcma.so.

    import cma
    cma.init("max_split_size_mb:256", backend="best")
    p = cma.malloc(1 << 20, device=0)
    cma.free(p)

Framework routes: cma.torch (PyTorch) and cma.cupy (CuPy).
"""
from cma._lib import (CmaError, advise, backend_name, device_of, empty_cache, forget_stream, free, host_view,
                      history, init, library_path, malloc, memory_snapshot, memory_stats, move, record_history, record_stream,
                      reset_peak_stats, set_disposable, sleep, wake,
                      set_memory_fraction, shutdown, snapshot, stats, synchronize)

__all__ = ["CmaError", "advise", "backend_name", "device_of", "empty_cache", "forget_stream", "free", "host_view",
           "history", "init", "library_path", "malloc", "memory_snapshot", "memory_stats", "move", "record_history", "record_stream",
           "reset_peak_stats", "set_disposable", "sleep", "wake",
           "set_memory_fraction",
           "shutdown", "snapshot", "stats", "synchronize"]
