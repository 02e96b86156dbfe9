"""cma as PyTorch's CUDA allocator for the whole process: use_as_default()
(re-exported by cma.torch; `python -m cma.torch` and CMA_TORCH call it for
an unchanged script, cma/_torch_start.py).

use_as_default() installs a C++ subclass of c10's CUDAAllocator
(_ext/cuda_allocator.h, compiled against the installed torch on first use)
before CUDA initialises. PyTorch's own tools then reach cma unpatched:
torch.cuda.memory_stats/memory_summary/_snapshot/_record_memory_history,
torch.cuda.graph and torch.compile(mode="reduce-overhead") (their private
pools live in cma's core), torch.cuda.MemPool/use_mem_pool,
caching_allocator_alloc, set_per_process_memory_fraction (cma's managed
budget), OOM observers, and torch.OutOfMemoryError on out-of-memory.
A MemPool with another allocator (MemPool(allocator), e.g. a
CUDAPluggableAllocator or NCCL's mem_allocator) takes its memory from that
allocator: it is one of cma's pools whose segments that allocator makes
(cma_pool_create_with_source), cached as every pool is. MemPool(no_split=True) and MemPool(use_on_oom=True)
work on cma's own pools too (allocator/mempool.h PoolOptions).
Not supported, with an error naming cma and the ways out: CUDA IPC of
tensors (torch.multiprocessing sharing: managed memory has no cudaIpc
handle); _ipc.py makes multiprocessing.Queue.put raise it in the caller.
"""
import os
import warnings

import torch

from cma import _lib, _torch_view
from cma.torch import _ipc, _patches
from cma.torch._ext import build
from cma.torch.training import learned, plan

_installed = False  # use_as_default() has made cma PyTorch's CUDA allocator


def use_as_default(config=None):
    """Makes this allocator PyTorch's CUDA allocator for the whole process
    (call it before anything initialises CUDA). `config` is a CMA_ALLOC_CONF
    string. Once cma is the allocator (python -m cma.torch, CMA_TORCH), a
    later call does nothing (a different `config` is warned about and not
    applied)."""
    global _installed
    if _installed:
        if config is not None and config != os.environ.get("CMA_ALLOC_CONF"):
            warnings.warn(f"cma.torch.use_as_default({config!r}): cma is PyTorch's allocator "
                          "already, with CMA_ALLOC_CONF="
                          f"{os.environ.get('CMA_ALLOC_CONF', '')!r}; the new config is not "
                          "applied", stacklevel=2)
        return
    if torch.cuda.is_initialized():
        raise RuntimeError("cma.torch.use_as_default() must run before CUDA is initialised "
                           "(PyTorch cannot change allocators once its own holds memory)")
    if config is not None:
        os.environ["CMA_ALLOC_CONF"] = config
    _lib.lib()  # loads libcma.so (and fails clearly if it cannot)
    build.install(_lib.library_path())
    _installed = True
    _ipc.install()
    _follow_pytorch_settings()
    plan.route_new_optimizer_state()
    if learned.enabled():
        learned.install()


def _follow_pytorch_settings():
    """PyTorch's allocator settings reach cma: the environment's now (kept by
    cma until its allocator exists), and at run time those of
    torch._C._accelerator_setAllocatorSettings (PyTorch's recommended
    setter, which goes straight to c10's AcceleratorAllocatorConfig and never
    to the CUDAAllocator, so only a Python patch sees it) and of the
    deprecated torch.cuda.memory._set_allocator_settings, after PyTorch has
    parsed and accepted them, once per call (_torch_view.SettingsFollower).
    Only the keys both share act (_lib.apply_pytorch_settings). Code that
    bound either function before use_as_default() (`from torch._C import
    _accelerator_setAllocatorSettings`) keeps PyTorch's own."""
    # PyTorch reads PYTORCH_ALLOC_CONF when it is set at all, else the older name.
    env = os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    if env:
        _lib.apply_pytorch_settings(env)
    _ACCELERATOR_SETTINGS.install()
    _SETTINGS.install()
    _SNAPSHOT.install()


_follower = _torch_view.SettingsFollower(_lib.apply_pytorch_settings)

_ACCELERATOR_SETTINGS = _patches.register(
    "torch._C._accelerator_setAllocatorSettings",
    lambda: [(torch._C, "_accelerator_setAllocatorSettings")], _follower.wrap)
_SETTINGS = _patches.register(
    "torch.cuda.memory._set_allocator_settings",
    lambda: [(torch.cuda.memory, "_set_allocator_settings")], _follower.wrap)


def _marking(original):
    """torch.cuda.memory._snapshot with what cma placed on the host marked
    (_torch_view.mark_snapshot: segments' "cma_on_host", blocks' "cma_away",
    and the key "cma")."""
    if getattr(original, "_cma_marks", False):
        return None

    def _snapshot(*args, **kwargs):
        snap = original(*args, **kwargs)
        return _torch_view.mark_snapshot(snap, _lib.snapshot(), _lib.host_snapshot(),
                                         _lib.config())

    _snapshot._cma_marks = True
    _snapshot._cma_wraps = original
    _snapshot.__doc__ = original.__doc__
    return _snapshot


# torch.cuda.memory._dump_snapshot looks _snapshot up in its module at call
# time, so the pickle memory_viz opens carries the marks too.
_SNAPSHOT = _patches.register(
    "torch.cuda.memory._snapshot", lambda: [(torch.cuda.memory, "_snapshot")], _marking)


def pool():
    """Retired: PyTorch's MemPool now lives in cma itself."""
    raise RuntimeError("cma.torch.pool() is retired: it stacked PyTorch's cache on top of "
                       "cma's. Call cma.torch.use_as_default() and use torch.cuda.MemPool() "
                       "with torch.cuda.use_mem_pool(pool): the pool then lives in cma.")
