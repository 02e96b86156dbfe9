"""Zero-copy tensor.to() for code that was not written for cma (PyTorch
RFC-0023's experiment), as a TorchFunctionMode:

    with cma.torch.zero_copy():
        layer.to("cuda")          # no copy: the same memory, migrated there
        y = layer(x)
        layer.to("cpu")           # and back, by prefetch

Inside the mode, Tensor.to(device), .cpu() and .cuda() of a tensor that owns
a whole cma allocation return an alias: a tensor on the target device over
the same memory (same data_ptr()), whose pages a prefetch (cma's move) puts
there. "Owns a whole allocation": the tensor's storage starts a cma
allocation and has the bytes requested for it (less under 512 bytes of
rounding), and the tensor views
all of it, contiguously, from offset 0 (every parameter and buffer of a
model allocated under cma.torch.use_as_default(), and every alias this mode
returned). Everything else falls back to PyTorch's own copy, unchanged: a
view or slice, a tensor packed inside a larger allocation (a suballocator's),
a dtype or memory-format change, copy=True, a target other than the CPU or
a CUDA device, a tensor that requires grad while autograd records (an alias
would carry no grad_fn), a tensor subclass other than nn.Parameter, and a
same-device .to() (PyTorch returns the tensor itself).

Aliasing semantics, exactly:
  * The alias and its source share memory: a write through either is seen
    through the other (in stream order; the CPU after a synchronize), which
    a copy would not do. Code that modifies the result of .to() and expects
    the source unchanged, or the reverse, must not run under this mode.
  * The source stays valid where it was: using it there migrates the pages
    back on demand (page faults), slower but correct; it is never stale.
  * The memory is freed when the source and every alias are gone: each alias
    holds the storage that owns the allocation, so replacing a parameter's
    .data with an alias (what nn.Module.to does) is safe.
  * .to("cpu") and .cpu() synchronise the current CUDA stream unless
    non_blocking=True (then synchronise before the CPU reads, as with a
    non-blocking copy). A move to a CUDA device is ordered on that device's
    current stream: kernels queued there afterwards see the data in place.
  * The alias never requires grad: nn.Module.to() runs under no_grad and
    sets .data, so parameters keep requires_grad and their identity.
  * The alias shares its source's version counter (as a view does): an
    in-place write through either is seen by autograd, so a tensor saved
    for backward and then overwritten through the other alias (a reused
    CPU staging buffer refilled before backward) makes backward raise
    "one of the variables needed for gradient computation has been
    modified by an inplace operation", where a copy would have kept the
    old values. Inference tensors have no counter: left apart.
  * In a forked child (a DataLoader worker) nothing is aliased: the
    parent's CUDA runtime is unusable there, so PyTorch's own copy runs
    (and raises its own error for a CUDA target).

ZeroCopyMode counts what it did: .aliased (zero-copy results) and .copied
(calls it handed to PyTorch).
"""
import os

import torch
from torch.overrides import TorchFunctionMode

from cma import _lib
from cma.torch import _alias

_TO, _CPU, _CUDA = torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda
_forked = False  # this process is a fork of the one that imported cma.torch


def _mark_forked():
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_mark_forked)


def _target(func, args, kwargs):
    """(device, dtype, non_blocking, memory_format) the call asks for, or
    None where it is not a plain device change this mode can alias."""
    if func is _CPU:
        if len(args) > 1 or set(kwargs) - {"memory_format"}:
            return None
        return torch.device("cpu"), None, False, kwargs.get("memory_format")
    if func is _CUDA:
        names = ("device", "non_blocking", "memory_format")
        if len(args) > 1 + len(names) or set(kwargs) - set(names):
            return None
        got = dict(zip(names, args[1:]), **kwargs)
        device = got.get("device")
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return torch.device(device), None, bool(got.get("non_blocking", False)), \
            got.get("memory_format")
    # Tensor.to: its three signatures, as PyTorch parses them. copy=True (a
    # keyword, or the second bool positional) asks for a copy.
    bools = [a for a in args[1:] if isinstance(a, bool)]
    if kwargs.get("copy", False) or (len(bools) >= 2 and bools[1]):
        return None
    try:
        device, dtype, non_blocking, fmt = torch._C._nn._parse_to(*args[1:], **kwargs)
    except Exception:  # PyTorch's own call raises the right error
        return None
    if device is None:
        return None
    return torch.device(device), dtype, bool(non_blocking), fmt


def _zero_copy(func, args, kwargs, wait_for_device=False):
    """The alias, or None to let PyTorch copy. `wait_for_device`: a move to
    a CUDA device also waits for its stream unless non_blocking (RFC-0023's
    rule, which the global switch follows; this mode orders it only)."""
    if _forked or not args or type(args[0]) not in (torch.Tensor, torch.nn.Parameter):
        return None
    t = args[0]
    # Only plain strided tensors alias; and never while tracing (torch.jit)
    # or capturing a CUDA graph, where PyTorch's copy is what is recorded.
    if t.layout != torch.strided or t.is_mkldnn or torch.jit.is_tracing():
        return None
    if torch.cuda.is_available() and torch.cuda.is_initialized() and \
            torch.cuda.is_current_stream_capturing():
        return None
    target = _target(func, args, kwargs)
    if target is None:
        return None
    device, dtype, non_blocking, fmt = target
    if dtype is not None and dtype != t.dtype:
        return None
    if fmt is not None and fmt != torch.preserve_format:
        return None
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda") or device == t.device:
        return None
    if t.device.type not in ("cpu", "cuda"):
        return None
    if t.requires_grad and torch.is_grad_enabled():
        return None
    if t.storage_offset() != 0 or not t.is_contiguous():
        return None
    storage = t.untyped_storage()
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    if nbytes == 0 or t.numel() * t.element_size() != nbytes:
        return None
    # Not a cma allocation, or not all of one (a framework may round the
    # request up a little; more than that means other tensors share it).
    size = _lib.allocation_size(ptr)
    if size is None or not nbytes <= size < nbytes + 512:
        return None
    cuda_dev = device if device.type == "cuda" else t.device
    stream = torch.cuda.current_stream(cuda_dev)
    try:
        _lib.move(ptr, "cpu" if device.type == "cpu" else device.index, stream.cuda_stream)
    except _lib.CmaError:  # refused (a pool context open, no prefetch here): PyTorch copies
        return None
    if not non_blocking and (device.type == "cpu" or wait_for_device):
        stream.synchronize()
    return _alias.make_alias(t, device)


def zero_copy():
    """`with cma.torch.zero_copy():` .to()/.cpu()/.cuda() alias cma tensors (this module's docstring)."""
    return ZeroCopyMode()


class ZeroCopyMode(TorchFunctionMode):
    """See the module's docstring; enter it with cma.torch.zero_copy()."""

    def __init__(self):
        super().__init__()
        self.aliased = 0
        self.copied = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Under cma.torch.managed_cpu() the methods are its wrappers.
        func = getattr(func, "_cma_wraps", func)
        if func is _TO or func is _CPU or func is _CUDA:
            out = _zero_copy(func, args, kwargs)
            if out is not None:
                self.aliased += 1
                return out
            self.copied += 1
        return func(*args, **kwargs)
