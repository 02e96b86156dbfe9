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
Not supported, with an error naming cma: CUDA IPC of tensors
(torch.multiprocessing sharing: managed memory has no cudaIpc handle).
"""
import os
import warnings

import torch

from cma import _lib
from cma.torch import _patches
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
    _follow_pytorch_settings()
    plan.route_new_optimizer_state()
    if learned.enabled():
        learned.install()


def _follow_pytorch_settings():
    """PyTorch's allocator settings reach cma: the environment's now (kept by
    cma until its allocator exists), torch.cuda.memory._set_allocator_settings'
    after PyTorch has parsed and accepted them. Only the keys both share act
    (_lib.apply_pytorch_settings)."""
    # PyTorch reads PYTORCH_ALLOC_CONF when it is set at all, else the older name.
    env = os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    if env:
        _lib.apply_pytorch_settings(env)
    _SETTINGS.install()


def _following(original):
    """torch.cuda.memory._set_allocator_settings, then the same settings to cma."""
    if getattr(original, "_cma_follows", False):
        return None

    def _set_allocator_settings(env):
        result = original(env)
        _lib.apply_pytorch_settings(env)
        return result

    _set_allocator_settings._cma_follows = True
    _set_allocator_settings.__doc__ = original.__doc__
    return _set_allocator_settings


_SETTINGS = _patches.register(
    "torch.cuda.memory._set_allocator_settings",
    lambda: [(torch.cuda.memory, "_set_allocator_settings")], _following)


def pool():
    """Retired: PyTorch's MemPool now lives in cma itself."""
    raise RuntimeError("cma.torch.pool() is retired: it stacked PyTorch's cache on top of "
                       "cma's. Call cma.torch.use_as_default() and use torch.cuda.MemPool() "
                       "with torch.cuda.use_mem_pool(pool): the pool then lives in cma.")
