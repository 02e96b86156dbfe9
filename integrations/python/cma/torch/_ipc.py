"""Sharing CUDA tensors between processes while cma is PyTorch's allocator
(issue 49): the refusal reaches the thread that asked.

CUDA IPC cannot export managed memory (cudaIpcGetMemHandle refuses it), so
cma's CUDAAllocator::shareIpcHandle raises (_ext/cuda_allocator.h, kNoIpc:
the message names the ways out). torch.multiprocessing reaches it whenever
its reducer pickles a CUDA tensor or storage (reductions.reduce_tensor ->
storage._share_cuda_() -> shareIpcHandle). Connection.send (Pipe),
SimpleQueue.put and a spawned Process's arguments pickle in the caller's
thread, so the error reaches the caller as it is. multiprocessing.Queue
(torch.multiprocessing.Queue is the same class) does not: put() appends to
a buffer and returns, a feeder thread pickles later, prints the error and
drops the item, and the consumer's get() waits forever.

So Queue.put and JoinableQueue.put, while cma is installed, pickle in the
caller (ForkingPickler, as the feeder would) when the object may hold a
CUDA tensor, and send those bytes: cma's refusal raises from put(), and the
object is pickled once (the feeder then copies bytes, and get() returns the
object). Everything else goes to the feeder unchanged, as in PyTorch:
  * nothing when CUDA is not initialised here (no CUDA tensor can exist):
    DataLoader workers and every CPU-only producer pay one call;
  * otherwise a bounded look (_MAX_ITEMS items, _MAX_DEPTH levels) through
    builtin containers and namedtuples; CPU tensors and storages, numpy
    arrays without objects, and scalars and strings cannot reach CUDA IPC.
    Anything the look cannot see through (another class, a container past
    the bounds) is pickled in the caller: a miss would be a hang.
Another pickling error in put() (a lambda, a non-leaf tensor) is left to
the feeder, as PyTorch does. A Queue subclass with its own
_on_queue_feeder_error handles feeder errors itself (concurrent.futures'
queue sets the future's exception, and its put() runs in the executor's
manager thread, which must not raise): left unchanged.
share_memory_() of a CUDA tensor does nothing in PyTorch (CUDA tensors are
shared by pickling): unchanged. A consumer under cma cannot open handles
from other processes either (getIpcDevPtr raises, naming cma).
Thread safety: the wrappers hold no state; install() runs under the GIL.
"""
import multiprocessing.queues
import multiprocessing.reduction
import pickle
import sys

import torch

from cma.torch import _patches

# The start of cma's refusal (cuda_allocator.cc's Unsupported() with the
# method shareIpcHandle); ipc_test.py checks the C++ still says it.
REFUSAL = "caching_managed_allocator does not support shareIpcHandle"

_MAX_ITEMS = 1000  # items looked at per put(): bounds its cost
_MAX_DEPTH = 8
_SCALARS = frozenset({type(None), bool, int, float, complex, str, bytes, bytearray,
                      range, type(Ellipsis)})
_CONTAINERS = (tuple, list, dict, set, frozenset)
_on = False  # install() ran and uninstall() did not: a wrapper another
#              library kept around after uninstall() passes calls through


class _Pickled:
    """An object put() pickled already. The feeder pickles this (a copy of
    the bytes); get() then unpickles the object itself through pickle.loads,
    so the consumer needs nothing of cma."""
    __slots__ = ("data",)

    def __init__(self, data):
        self.data = bytes(data)  # ForkingPickler.dumps gives a memoryview

    def __reduce__(self):
        return pickle.loads, (self.data,)


def _is_cuda(x):
    device = getattr(x, "device", None)
    return getattr(device, "type", None) == "cuda"


def may_hold_cuda(obj):
    """Whether pickling `obj` may reach a CUDA tensor or storage: True when
    one is found, and when the look cannot see through something."""
    numpy = sys.modules.get("numpy")  # only if the program imported it
    plain_tensors = (torch.Tensor, torch.nn.Parameter)
    storages = (torch.UntypedStorage, torch.TypedStorage)
    stack, seen = [(obj, 0)], 0
    while stack:
        x, depth = stack.pop()
        t = type(x)
        if t in _SCALARS:
            continue
        if isinstance(x, torch.Tensor):
            # A subclass may carry tensors of its own (wrapper subclasses).
            if _is_cuda(x) or t not in plain_tensors:
                return True
            continue
        if isinstance(x, storages):
            if _is_cuda(x):
                return True
            continue
        if numpy is not None and isinstance(x, numpy.ndarray) and not x.dtype.hasobject:
            continue
        # Builtin containers, namedtuples, and subclasses with no attributes
        # of their own (those could hold a tensor the look would not see).
        if not isinstance(x, _CONTAINERS) or getattr(x, "__dict__", None):
            return True
        seen += len(x)
        if seen > _MAX_ITEMS or depth >= _MAX_DEPTH:
            return True
        items = x.items() if isinstance(x, dict) else ((i,) for i in x)
        for item in items:
            stack.extend((part, depth + 1) for part in item)
    return False


def _feeder_errors_are_ours(queue):
    base = multiprocessing.queues.Queue._on_queue_feeder_error
    return getattr(type(queue), "_on_queue_feeder_error", base) is base


def _caller_pickling(original):
    """Queue.put (or JoinableQueue.put) that pickles in the caller when the
    object may hold a CUDA tensor."""
    if getattr(original, "_cma_wraps", None) is not None:
        return None

    def put(self, obj, block=True, timeout=None):
        if (not _on or not torch.cuda.is_initialized() or not _feeder_errors_are_ours(self)
                or not may_hold_cuda(obj)):
            return original(self, obj, block, timeout)
        try:
            data = multiprocessing.reduction.ForkingPickler.dumps(obj)
        except Exception as e:  # noqa: BLE001 - only cma's refusal is raised here
            if REFUSAL in str(e):
                raise
            return original(self, obj, block, timeout)  # the feeder reports it, as in PyTorch
        return original(self, _Pickled(data), block, timeout)

    put._cma_wraps = original
    put.__doc__ = original.__doc__
    return put


_QUEUE_PUT = _patches.register(
    "multiprocessing.queues.Queue.put",
    lambda: [(multiprocessing.queues.Queue, "put")], _caller_pickling)
# JoinableQueue has a put() of its own.
_JOINABLE_PUT = _patches.register(
    "multiprocessing.queues.JoinableQueue.put",
    lambda: [(multiprocessing.queues.JoinableQueue, "put")], _caller_pickling)


def install():
    """Called by use_as_default() once cma is PyTorch's allocator."""
    global _on
    _on = True
    _QUEUE_PUT.install()
    _JOINABLE_PUT.install()


def uninstall():
    global _on
    _on = False
    _QUEUE_PUT.uninstall()
    _JOINABLE_PUT.uninstall()
