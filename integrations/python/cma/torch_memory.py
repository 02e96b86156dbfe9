"""PyTorch's memory tools for cma's default route.

Under torch.cuda.memory.change_current_allocator PyTorch's own
memory_stats(), memory_summary(), max_memory_*(), reset_peak_memory_stats()
and memory._snapshot() raise ("CUDAPluggableAllocator does not yet support
..."): the pluggable allocator has no hook for them. This module gives the
same functions with the same keys and the snapshot in memory._snapshot()'s
format (segments with blocks; device_traces while recording), so
torch.cuda._memory_viz renders it. install() puts them in place of
PyTorch's (cma.torch.use_as_default() does, unless told not to), so code
that calls torch.cuda.max_memory_allocated() keeps working.
"""
import torch

from cma import _lib
from cma import torch_format

# PyTorch's own table, kept before install() replaces the public name.
_torch_memory_summary = torch.cuda.memory.memory_summary


def _index(device):
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


def memory_stats(device=None):
    """torch.cuda.memory_stats() for cma: PyTorch's keys, sorted, plus cma's
    own (placement, arena and symmetric counters)."""
    s = _lib.stats(_index(device))
    for metric in ("oversize_allocations", "oversize_segments"):  # no such thing in cma
        for k in ("current", "peak", "allocated", "freed"):
            s.setdefault(f"{metric}.{k}", 0)
    s.setdefault("max_split_size", -1)
    return dict(sorted(s.items()))


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    _lib.reset_peak_stats(_index(device))


def memory_summary(device=None, abbreviated=False):
    """torch.cuda.memory_summary()'s table, from cma's statistics."""
    from torch.cuda import memory as tm
    saved = tm.memory_stats
    tm.memory_stats = memory_stats  # the table reads stats through this name
    try:
        return _torch_memory_summary(device=device, abbreviated=abbreviated)
    finally:
        tm.memory_stats = saved


def snapshot():
    """torch.cuda.memory._snapshot()'s format for cma's memory."""
    return torch_format.snapshot(_lib.snapshot(), _lib.history(),
                                 max(torch.cuda.device_count(), 1))


def record_memory_history(enabled="all", context=None, stacks=None, max_entries=100_000,
                          **_ignored):
    """torch.cuda.memory._record_memory_history() for cma (no stack frames)."""
    _lib.record_history(enabled not in (None, False), max_entries)


def install():
    """Replaces PyTorch's memory functions, which cannot see a pluggable
    allocator, with these."""
    import torch.cuda.memory as tm
    for name, fn in (("memory_stats", memory_stats), ("memory_allocated", memory_allocated),
                     ("max_memory_allocated", max_memory_allocated),
                     ("memory_reserved", memory_reserved),
                     ("max_memory_reserved", max_memory_reserved),
                     ("reset_peak_memory_stats", reset_peak_memory_stats),
                     ("memory_summary", memory_summary)):
        setattr(tm, name, fn)
        setattr(torch.cuda, name, fn)
    tm._snapshot = snapshot
    tm._record_memory_history = record_memory_history
