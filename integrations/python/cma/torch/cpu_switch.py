"""PyTorch RFC-0023's unified memory mode for the whole process: CPU tensors
in managed memory, and tensor.to() that changes only the device made a move.

    cma.torch.use_as_default()       # cma serves CUDA tensors (before CUDA starts)
    cma.torch.managed_cpu()          # the switch: CPU tensors are managed memory
    x = torch.randn(1 << 26)         # on the host, in cma's host pool
    y = x.to("cuda")                 # the same memory, migrated: no copy
    z = y.cpu()                      # and back
    cma.torch.managed_cpu(False)     # PyTorch's CPU allocator again

While the switch is on:
  * Every CPU tensor PyTorch allocates comes from cma's host pool (statistics:
    cma.host_stats()). A tensor allocated while on stays cma's until it dies.
    A DataLoader worker (a forked child) allocates from PyTorch's own CPU
    allocator: its parent's CUDA runtime is unusable there. Tensors made
    over foreign memory (torch.from_numpy, torch.frombuffer, shared memory
    from workers, mmap'ed checkpoints) are not managed.
  * A forked child cannot read managed memory: CUDA does not copy it into
    children. So a DataLoader with workers and no chosen start method
    starts them with forkserver while the switch is on (a notice says so
    once; dataloader.py has the rules and the opt-out), and the
    switch stays off in multiprocessing's bootstrap processes. A child the
    user forks himself that touches such memory is stopped by the kernel
    (SIGSEGV) after a message saying why.
  * Tensor.to(), .cuda() and .cpu() that change only the device of a tensor
    owning a whole cma allocation (zero_copy_mode.py says exactly which)
    return an alias over the same memory, whose pages cma moves to the
    target in the order of its current CUDA stream. Following the RFC, the
    call waits for the move unless non_blocking=True (as PyTorch's copy
    waits for its stream). copy=True, a dtype or memory-format change, a
    view, and a tensor that requires grad while autograd records are
    copied as before. Inside torch.compile'd code .to() is traced as
    PyTorch's copy.
  * Aliasing: the source and the result share memory, so an in-place write
    through one is seen through the other (a copy would not be), and they
    share one version counter: autograd sees a write through the other
    alias, so refilling a CPU buffer whose alias a forward saved raises at
    backward ("... modified by an inplace operation") instead of computing
    gradients from the new contents. Tensors that require grad are copied
    (an alias would carry no grad_fn).
    Using the source where it was after the move is correct and
    migrates the pages back on demand.
  * pin_memory() of a managed tensor copies it into pinned memory, as for
    any pageable tensor; with the switch, pinned memory is not needed to
    reach the GPU. Pickling, torch.save and share_memory_() work as for any
    CPU tensor (share_memory_() copies into shared memory, which is then no
    longer managed).

Per tensor, with or without the switch: managed(t) returns a managed CPU
copy of t, empty_managed(...) a new managed CPU tensor.
"""
import concurrent.futures
import functools
import os
import threading

import torch

from cma import _lib
from cma.torch import _patches
from cma.torch import dataloader as _dataloader
from cma.torch import zero_copy_mode as _zc
from cma.torch._ext import build

_TO, _CPU, _CUDA = _zc._TO, _zc._CPU, _zc._CUDA


class _Counts:
    """What the switch's .to()/.cpu()/.cuda() did since it was turned on."""

    def __init__(self):
        self.moved = 0        # calls answered with an alias
        self.moved_bytes = 0
        self.copied = 0       # calls handed to PyTorch's copy

    def as_dict(self):
        return {"moved": self.moved, "moved_bytes": self.moved_bytes, "copied": self.copied}


_counts = _Counts()
_on = False
# RFC-0023's enabled_uvm_move_on_copy: while the switch is on, .to()/.cpu()/
# .cuda() that change only the device are moves. managed_cpu() turns it on
# with the switch (its documented behaviour); RFC-0023's names leave it off
# until set_uvm_move_on_copy(True) (uvm.py).
_move_on_copy = False


def _move_or_copy(base, current):
    """`current` (the attribute now: PyTorch's method or another library's
    wrapper of it), made a move where `base` (PyTorch's) can be aliased."""
    @functools.wraps(current)
    def method(self, *args, **kwargs):
        if not torch.compiler.is_compiling():
            out = _zc._zero_copy(base, (self,) + args, kwargs, wait_for_device=True)
            if out is not None:
                _counts.moved += 1
                _counts.moved_bytes += out.untyped_storage().nbytes()
                return out
            _counts.copied += 1
        return current(self, *args, **kwargs)
    method._cma_wraps = base
    return method


def _method_patch(name, base):
    """Tensor.<name> made a move where PyTorch's `base` can be aliased; put
    back as it was found (another library's wrapper included) when the
    switch is turned off."""
    return _patches.register(f"torch.Tensor.{name}", lambda: [(torch.Tensor, name)],
                             lambda current: _move_or_copy(base, current), restore="always")


_METHODS = (_method_patch("to", _TO), _method_patch("cpu", _CPU), _method_patch("cuda", _CUDA))


def managed_cpu(enabled=True, move_on_copy=True):
    """Turns the switch on (the default) or off; returns whether it was on.
    `move_on_copy` (turning it on, or while it is on): .to(), .cpu() and
    .cuda() that change only the device are moves (default); False leaves
    them PyTorch's copies (RFC-0023's enabled_uvm_move_on_copy off; cma.torch.
    uvm_to still moves). Turning it on compiles cma's PyTorch extension on
    first use, as use_as_default() does."""
    global _on, _counts
    was = _on
    if enabled and _dataloader.in_bootstrap_process():
        return False  # dataloader.py says why
    if enabled and not _on:
        _dataloader.install()
        _lib.lib()
        build.build().cpu_on(_lib.library_path())
        _counts = _Counts()
        _on = True
    elif not enabled and _on:
        build.build().cpu_off()
        for patch in _METHODS:  # what was there, another patch included; the flag kept
            patch.uninstall()
        _dataloader.uninstall()
        _on = False
    if enabled and _on:
        _set_moves(move_on_copy)
    return was


def _set_moves(on):
    """The .to()/.cpu()/.cuda() patches in place (on) or PyTorch's methods,
    or another library's wrapper of them, back (off)."""
    global _move_on_copy
    _move_on_copy = bool(on)
    for patch in _METHODS:
        if on:
            patch.install()
        else:
            patch.uninstall()  # what was there, another patch included


def is_managed_cpu():
    return _on


def set_move_on_copy(enabled):
    """RFC-0023's set_uvm_move_on_copy: whether .to()/.cpu()/.cuda() that
    change only the device are moves while the switch is on; kept for the
    next time it is turned on through set_enabled_uvm (uvm.py)."""
    global _move_on_copy
    if _on:
        _set_moves(enabled)
    else:
        _move_on_copy = bool(enabled)


def move_on_copy():
    """Whether .to()/.cpu()/.cuda() that change only the device are moves
    (now, while the switch is on; else once set_enabled_uvm turns it on)."""
    return _move_on_copy


def move_or_copy(tensor, device, non_blocking=False):
    """tensor.to(device) as the switch with moves does it, whatever the switch
    and the flag: a move where the tensor owns a whole cma allocation (the
    rules of zero_copy_mode.py), else PyTorch's copy. RFC-0023's uvm_to."""
    if not torch.compiler.is_compiling():
        out = _zc._zero_copy(_TO, (tensor, device), {"non_blocking": non_blocking},
                             wait_for_device=True)
        if out is not None:
            return out
    return _TO(tensor, device, non_blocking=non_blocking)


def move_counts():
    """{"moved", "moved_bytes", "copied"}: the switch's .to()/.cpu()/.cuda()
    calls answered by a move (no byte copied) and handed to PyTorch's copy."""
    return _counts.as_dict()


class _Allocation:
    """Frees a host-pool allocation when the last tensor over it dies; in a
    forked child (whose CUDA runtime is unusable) it leaks instead."""
    __slots__ = ("ptr", "pid")

    def __init__(self, ptr):
        self.ptr, self.pid = ptr, os.getpid()

    def __del__(self):
        if _lib is not None and self.ptr and os is not None and self.pid == os.getpid():
            _lib.free(self.ptr)


def empty_managed(*size, dtype=None):
    """A new CPU tensor in cma's host pool (contents undefined), with or
    without the switch; .to() under the switch or zero_copy() moves it."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    dtype = dtype or torch.get_default_dtype()
    numel = 1
    for s in size:
        numel *= s
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(size, dtype=dtype)
    ptr = _lib.malloc(nbytes, "cpu")
    raw = torch.from_numpy(_lib.host_view(ptr, nbytes, owner=_Allocation(ptr)))
    return raw.view(dtype).view(size)


def managed(tensor, copy_threads=1):
    """A managed CPU copy of `tensor` (any device), contiguous. A CPU source
    of 16 MiB or more is copied by `copy_threads` threads in slices (PyTorch
    releases the GIL while it copies; DataLoader's pin-memory thread runs
    PyTorch single-threaded)."""
    out = empty_managed(tensor.shape, dtype=tensor.dtype)
    _parallel_copy(out, tensor, copy_threads)
    return out


_PARALLEL_COPY_MIN = 16 << 20
_copy_pool = None  # (pid, executor): a forked child's executor has no threads
_copy_pool_lock = threading.Lock()


def _parallel_copy(out, src, threads):
    global _copy_pool
    if (threads <= 1 or src.device.type != "cpu" or not src.is_contiguous()
            or src.numel() * src.element_size() < _PARALLEL_COPY_MIN):
        out.copy_(src)
        return
    with _copy_pool_lock:
        if (_copy_pool is None or _copy_pool[0] != os.getpid()
                or _copy_pool[1]._max_workers < threads):
            _copy_pool = (os.getpid(), concurrent.futures.ThreadPoolExecutor(
                max_workers=threads, thread_name_prefix="cma-copy"))
        pool = _copy_pool[1]
    o, s = out.view(-1), src.view(-1)
    step = -(-o.numel() // threads)
    jobs = [pool.submit(o[i:i + step].copy_, s[i:i + step]) for i in range(0, o.numel(), step)]
    for j in jobs:
        j.result()


def _move_storage(storage, device):
    """A storage on `device` over the same managed memory as `storage` (a
    CPU storage that owns a whole cma allocation), or None."""
    if storage.nbytes() == 0:
        return None
    t = torch.empty(0, dtype=torch.uint8).set_(storage)
    moved = _zc._zero_copy(_TO, (t, device), {"non_blocking": True})
    return None if moved is None else moved.untyped_storage()


def map_location(device="cuda"):
    """torch.load(f, map_location=cma.torch.map_location("cuda")): every
    storage is read into managed memory and moved to `device` in the order
    of its current stream, so that the move of one overlaps the reading of
    the next; nothing is copied by a copy engine. A storage that is not
    cma's already (the switch off, or mmap=True) is first copied into the
    host pool on the CPU. The result is ready once the device's current
    stream is (torch.cuda.synchronize() or any kernel queued after it)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())

    def restore(storage, location):
        moved = _move_storage(storage, device)
        if moved is None and storage.nbytes() > 0:
            staged = empty_managed(storage.nbytes(), dtype=torch.uint8)
            staged.copy_(torch.empty(0, dtype=torch.uint8).set_(storage))
            moved = _move_storage(staged.untyped_storage(), device)
        return moved if moved is not None else storage.to(device)
    return restore


_SHARED_SLAB_BYTES = 1 << 20  # host allocations this small share pages


def prefer_host(tensor):
    """Advice for a tensor in cma's host pool: its pages stay on the host,
    and a move to a GPU maps them there instead of migrating them (the GPU
    reads and writes them over the link). Right for data a GPU touches about
    once (a batch, a CPU/GPU round trip); wrong for data it reuses (weights).
    Tensors of 1 MiB or less are left as they are (they share pages)."""
    if tensor.untyped_storage().nbytes() > _SHARED_SLAB_BYTES:
        _lib.advise(tensor.untyped_storage().data_ptr(), False, "cpu", ())
    return tensor


class ManagedBatches:
    """A DataLoader collate_fn whose batches land in managed memory in the
    main process: DataLoader(..., collate_fn=ManagedBatches(), pin_memory=True)
    then calls the batch's pin_memory(), which copies it from the workers'
    shared memory into cma's host pool (instead of into pinned memory), and
    .to("cuda") under the switch moves it without a copy. `map` (default):
    the batch's pages stay on the host and the GPU reads them over the link
    (prefer_host), which measured faster than migrating them for a batch
    read once; map=False migrates them. `copy_threads` threads copy each
    batch of 16 MiB or more (PyTorch's pin-memory thread copies with one,
    which bounds a pipeline of large batches: on an H200 with 8 workers and
    77 MB batches, 4 threads took the copy from 15.6 to 5.7 ms a batch)."""

    def __init__(self, collate_fn=None, map=True, copy_threads=4):
        if copy_threads < 1:
            raise ValueError(f"cma.torch.ManagedBatches: copy_threads={copy_threads} (at least 1)")
        self.collate_fn = collate_fn or torch.utils.data.default_collate
        self.map = map
        self.copy_threads = copy_threads

    def __call__(self, samples):
        return _ManagedBatch(self.collate_fn(samples), self.map, self.copy_threads)


class _ManagedBatch:
    def __init__(self, data, map_pages, copy_threads):
        self.data = data
        self.map_pages = map_pages
        self.copy_threads = copy_threads

    def _unpinned(self, *args):
        raise TypeError("cma.torch.ManagedBatches: the DataLoader needs pin_memory=True (its "
                        "pin-memory step is what copies each batch into cma's host pool)")

    __iter__ = __getitem__ = __len__ = _unpinned

    def pin_memory(self, device=None):
        copy = lambda t: managed(t, self.copy_threads)  # noqa: E731
        if self.map_pages:
            return _map_tensors(self.data, lambda t: prefer_host(copy(t)))
        return _map_tensors(self.data, copy)


def _map_tensors(data, fn):
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (list, tuple)):
        return type(data)(_map_tensors(d, fn) for d in data)
    if isinstance(data, dict):
        return {k: _map_tensors(v, fn) for k, v in data.items()}
    return data
