"""PyTorch's CUDA allocator, served by caching_managed_allocator.

use_as_default() makes cma PyTorch's CUDA allocator for the whole process:
a C++ subclass of c10's CUDAAllocator (cma/torch_allocator.h, compiled
against the installed torch on first use), installed before CUDA
initialises. PyTorch's own tools then reach cma unpatched:
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

move(tensor, device) is RFC-0023's zero-copy tensor.to(): the returned tensor
aliases the same managed memory (same data_ptr) on the other device; the data
migrates, nothing is copied, and the original storage is kept alive.
"""
import os

import torch

from cma import _lib
# RFC-0023's switch and its helpers (torch_managed.py).
from cma.torch_managed import (ManagedBatches, empty_managed, is_managed_cpu,  # noqa: F401
                               managed, managed_cpu, map_location, move_counts, prefer_host)


def use_as_default(config=None):
    """Makes this allocator PyTorch's CUDA allocator for the whole process
    (call it before anything initialises CUDA). `config` is a CMA_ALLOC_CONF
    string."""
    if torch.cuda.is_initialized():
        raise RuntimeError("cma.torch.use_as_default() must run before CUDA is initialised "
                           "(PyTorch cannot change allocators once its own holds memory)")
    if config is not None:
        os.environ["CMA_ALLOC_CONF"] = config
    from cma import torch_allocator
    _lib.lib()  # loads libcma.so (and fails clearly if it cannot)
    torch_allocator.install(_lib.library_path())
    _follow_pytorch_settings()
    _route_new_optimizer_state()


def _follow_pytorch_settings():
    """PyTorch's allocator settings reach cma: the environment's now (kept by
    cma until its allocator exists), torch.cuda.memory._set_allocator_settings'
    after PyTorch has parsed and accepted them. Only the keys both share act
    (_lib.apply_pytorch_settings)."""
    # PyTorch reads PYTORCH_ALLOC_CONF when it is set at all, else the older name.
    env = os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    if env:
        _lib.apply_pytorch_settings(env)
    memory = torch.cuda.memory
    original = getattr(memory, "_set_allocator_settings", None)
    if original is None or getattr(original, "_cma_follows", False):
        return

    def _set_allocator_settings(env):
        result = original(env)
        _lib.apply_pytorch_settings(env)
        return result

    _set_allocator_settings._cma_follows = True
    _set_allocator_settings.__doc__ = original.__doc__
    memory._set_allocator_settings = _set_allocator_settings


def pool():
    """Retired: PyTorch's MemPool now lives in cma itself."""
    raise RuntimeError("cma.torch.pool() is retired: it stacked PyTorch's cache on top of "
                       "cma's. Call cma.torch.use_as_default() and use torch.cuda.MemPool() "
                       "with torch.cuda.use_mem_pool(pool): the pool then lives in cma.")


def _index(device=None):
    """The CUDA device index `device` names: the current device for None or
    for "cuda" without an index, as PyTorch reads them."""
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise ValueError(f"cma.torch: {device!r} is not a CUDA device")
    return torch.cuda.current_device() if d.index is None else d.index


def _owned_storage(tensor):
    ptr = tensor.untyped_storage().data_ptr()
    if _lib.allocation_size(ptr) is None:
        raise ValueError("cma.torch: the tensor does not own a cma allocation (allocate it "
                         "under cma.torch.use_as_default(), or on the CPU under "
                         "cma.torch.managed_cpu())")
    return ptr, tensor.untyped_storage().nbytes()


class _CudaBuffer:
    def __init__(self, ptr, nbytes, owner):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "stream": None}


def _alias(tensor, ptr, nbytes, device):
    """A tensor over the same storage bytes on `device`, viewed like `tensor`."""
    if device.type == "cpu":
        raw = torch.from_numpy(_lib.host_view(ptr, nbytes, owner=tensor))
    else:
        raw = torch.as_tensor(_CudaBuffer(ptr, nbytes, tensor), device=device)
    from cma.torch_zero_copy import share_version  # one version counter (autograd sees writes)
    return share_version(raw, tensor).view(tensor.dtype).as_strided(
        tensor.size(), tensor.stride(), tensor.storage_offset())


def forget_stream(stream):
    """Call before a torch.cuda.Stream that used cma tensors is destroyed:
    waits for its work; its cached blocks then serve any stream and cma
    never uses it again (so empty_cache can release them)."""
    _lib.forget_stream(stream.cuda_stream)


def move(tensor, device, stream=None, non_blocking=False):
    """Zero-copy tensor.to(device) for a tensor allocated by this allocator.

    Ordered on `stream` (default: the current stream of the tensor's CUDA
    device, or of the target device). A move to the CPU synchronises that
    stream unless non_blocking is set, in which case the caller must
    synchronise before the CPU reads the data."""
    device = torch.device(device)
    ptr, nbytes = _owned_storage(tensor)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cuda_dev = device if device.type == "cuda" else tensor.device
    if cuda_dev.type != "cuda":  # the host to the host: any device's stream orders it
        owner = _lib.device_of(ptr)
        cuda_dev = torch.device("cuda", torch.cuda.current_device() if owner is None else owner)
    if stream is None:
        stream = torch.cuda.current_stream(cuda_dev)
    _lib.move(ptr, "cpu" if device.type == "cpu" else device.index, stream.cuda_stream)
    if device.type == "cpu" and not non_blocking:
        stream.synchronize()
    return _alias(tensor, ptr, nbytes, device)


def prefetch(tensor, device=None, stream=None):
    """Migrates a tensor's memory towards `device` (default: where it is)."""
    device = torch.device(device) if device is not None else tensor.device
    ptr, _ = _owned_storage(tensor)
    cuda_dev = device if device.type == "cuda" else torch.device("cuda", _lib.device_of(ptr))
    stream = stream or torch.cuda.current_stream(cuda_dev)
    _lib.move(ptr, "cpu" if device.type == "cpu" else _index(device), stream.cuda_stream)


def mark_disposable(tensor, disposable=True):
    """sleep() may throw this tensor's contents away (a KV cache); cleared
    when its memory is freed."""
    ptr, _ = _owned_storage(tensor)
    _lib.set_disposable(ptr, disposable)


def mark_keep(tensor, keep=True):
    """sleep(level=2) keeps this tensor's contents; cleared when its memory is freed."""
    ptr, _ = _owned_storage(tensor)
    _lib.set_keep(ptr, keep)


def sleep(device=None, stream=None, level=1):
    """Sleep mode, vLLM's levels, addresses kept: every cma tensor of the
    device leaves it and the idle cache is given back, so another process can
    cudaMalloc that memory (cudaMemGetInfo does not show it free); same
    tensors, same addresses after wake(). Returns the bytes.
      level 1: every tensor not marked disposable keeps its contents, copied
        at the copy engine's speed into pinned host staging that stays
        allocated across cycles (memory_stats()["host_staging_bytes.all.
        current"], at most CMA_ALLOC_CONF's sleep_staging_max; the rest
        migrates); release_staging() gives it back.
      level 2: only tensors marked with mark_keep() keep theirs; the rest
        are discarded (reload them after wake()).
      level 0: kept tensors migrate to the host by prefetch (slower; their
        contents stay readable from the CPU while asleep).
    Disposable tensors (mark_disposable) are always discarded. At levels 1
    and 2 a sleeping tensor's contents are reachable only through wake() or
    move(): reading it otherwise sees garbage."""
    device = torch.device("cuda", _index(device))
    stream = stream or torch.cuda.current_stream(device)
    n = _lib.sleep(device.index, stream.cuda_stream, level)
    stream.synchronize()
    return n


def wake(device=None, stream=None, release_staging=False):
    """Brings every cma tensor of the device back (disposable and discarded
    ones populated empty, not migrated). Work queued on `stream` afterwards
    sees them. With release_staging, the pinned staging is given back once
    the copies out of it are done (the next sleep pins it again)."""
    device = torch.device("cuda", _index(device))
    stream = stream or torch.cuda.current_stream(device)
    n = _lib.wake(device.index, stream.cuda_stream)
    if release_staging:
        _lib.release_sleep_staging(device.index)
    return n


def release_staging(device=None):
    """Gives back the pinned host memory sleep() keeps between cycles; returns the bytes."""
    return _lib.release_sleep_staging(_index(device))


def zero_copy():
    """`with cma.torch.zero_copy():` .to()/.cpu()/.cuda() alias cma tensors (torch_zero_copy.py)."""
    from cma import torch_zero_copy; return torch_zero_copy.ZeroCopyMode()  # noqa: E702


class _HostTier:
    def __init__(self, device):
        self._device = device

    def __enter__(self):
        _lib.set_host_routing(True, self._device)
        return self

    def __exit__(self, *exc):
        _lib.set_host_routing(False, self._device)
        return False


def host_tier(device=None):
    """`with cma.torch.host_tier():` oversubscription (CMA_ALLOC_CONF
    oversubscribe:1): the device's allocations made inside (by any thread)
    live on the host, read and written by the GPU over the link. Without
    oversubscription it raises at entry."""
    return _HostTier(_index(device))


def _state_incomplete(optimizer, params):
    # A step that creates state: the first, or one after parameters were added.
    return any(len(optimizer.state.get(p, {})) == 0 for p in params if p.grad is not None)


def _oversubscribed_devices(params):
    """The CUDA devices of `params` whose cma budget has a host part."""
    out = set()
    for p in params:
        if p.is_cuda and p.device.index not in out:
            if _lib.stats(p.device.index).get("host_budget_bytes", 0) > 0:
                out.add(p.device.index)
    return out


def _state_tiers(optimizer, params):
    """Host tiers to enter while a step creates state for `params` outside
    optimizer.step() (torch_step_in_backward.py): where the optimizer
    hooks below, or host_resident()'s, would route it."""
    if getattr(optimizer, "_cma_host_resident", False):
        devices = {p.device.index for p in params if p.is_cuda}
    else:
        devices = _oversubscribed_devices(params)
    return [_HostTier(d) for d in sorted(devices)]


def _route_new_optimizer_state():
    """Oversubscription's default placement for training: every optimizer's
    state lives on the host (updated by torch_staged_step.py), and saved
    activations make room when a step overflows (torch_offload.py). The state is touched once per step (the
    optimizer reads and writes it over the link), while parameters and
    activations are touched many times: they keep the device. Global
    torch.optim hooks route the allocations of a step that creates state
    (its first) to the host, and mark each step's end, so that the next
    step follows the plan learnt from the last (which of its allocations
    live on the host: CachingManagedAllocator::MarkIteration); without
    oversubscription they do nothing after one check per optimizer."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    import weakref
    known = weakref.WeakKeyDictionary()  # optimizer -> devices with a host part, or ()
    entered = []

    def before(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        devices = known.get(opt)
        if devices is None:
            devices = known[opt] = tuple(sorted(_oversubscribed_devices(params)))
            if devices:
                # Its host-resident state is updated staged from the next
                # step, and activations make room when a step overflows.
                from cma import torch_offload, torch_staged_step
                torch_staged_step.attach(opt)
                torch_offload.watch(devices, params)
        if devices:  # the staging runs after the optimizer's own pre-hooks, also later ones
            from cma import torch_staged_step
            torch_staged_step.order_last(opt)
        if devices and getattr(opt, "_cma_host_resident", False) is False and \
                _state_incomplete(opt, params):
            for d in devices:
                t = _HostTier(d)
                t.__enter__()
                entered.append(t)

    def after(opt, args, kwargs):
        while entered:
            entered.pop().__exit__(None, None, None)
        # A step ends an iteration: the next follows the plan learnt from it.
        devices = known.get(opt, ())
        if devices:
            from cma import torch_offload
            torch_offload.end_step(devices)
        for d in devices:
            _lib.mark_iteration(d)

    register_optimizer_step_pre_hook(before)
    register_optimizer_step_post_hook(after)


def host_resident(optimizer):
    """Oversubscription hint, one line after building the optimizer: its
    state (created by its first step) lives on the host, where each step
    reads and writes it once over the link, leaving the device to the
    parameters and activations. State that already exists is copied there
    now. Every parameter must be a CUDA tensor cma owns (else ValueError,
    nothing changed)."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"cma.torch.host_resident: {type(optimizer).__name__} is not a "
                        "torch.optim.Optimizer")
    params = [p for g in optimizer.param_groups for p in g["params"]]
    devices = set()
    for p in params:
        if not p.is_cuda or _lib.device_of(p.untyped_storage().data_ptr()) is None:
            raise ValueError("cma.torch.host_resident: a parameter of the optimizer is not a "
                             f"CUDA tensor cma owns ({tuple(p.shape)} on {p.device})")
        devices.add(p.device.index)
    for p in params:  # state made by earlier steps
        for key, t in list(optimizer.state.get(p, {}).items()):
            if torch.is_tensor(t) and t.is_cuda and not _lib.placed_on_host(t.data_ptr()):
                with host_tier(t.device):
                    optimizer.state[p][key] = t.clone()
    tiers = [_HostTier(d) for d in sorted(devices)]
    entered = []

    optimizer._cma_host_resident = True  # the global hook leaves it to these

    def before(opt, args, kwargs):
        # Only a step that creates state routes (the first, or one after
        # new parameters were added); later steps allocate on the device.
        if _state_incomplete(opt, params):
            for t in tiers:
                t.__enter__()
                entered.append(t)

    def after(opt, args, kwargs):
        while entered:
            entered.pop().__exit__(None, None, None)

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)
    return optimizer


def step_in_backward(optimizer, enabled=True, bucket_mib=64, sms=8, free_grads=False):
    """Opt-in hint, one line after building the optimizer: each parameter
    is updated during backward, as soon as its gradient is final (every
    `bucket_mib` of parameters, on a side stream limited to `sms` SMs where
    torch offers green contexts; 0: all); when backward ends the caller's
    stream waits for those updates, and optimizer.step() has only what came
    some other way to apply. Beyond the GPU's memory this overlaps the
    link-bound step with backward; results stay bit-identical. A loop gives
    the plain loop's result or raises naming the fix: the first two steps
    are plain and checked (hyperparameters or gradients changed between
    backward and step, a second backward, gradients discarded without a
    step raise there, before anything changed); later the same misuse
    raises after that backward's updates. Gradients stay readable after
    backward; free_grads=True frees each once applied (less memory; None
    after backward). torch_step_in_backward.py and docs/pytorch.md state
    the contract. TypeError for a non-optimizer, ValueError (nothing
    changed) for one whose update is not elementwise, a non-CUDA parameter,
    a differentiable group, a parameter hinted by another live optimizer,
    or torch.distributed initialised. enabled=False removes it. Returns the
    optimizer."""
    from cma import torch_step_in_backward
    if not enabled:
        return torch_step_in_backward.detach(optimizer)
    return torch_step_in_backward.attach(optimizer, bucket_mib, sms, free_grads)


def activation_offload(enabled=None, mib=None):
    """Oversubscription's activation offload (torch_offload.py): on or off
    for steps from now on (off, no hook of cma's stays installed); `mib`
    moves at least that many MiB of each step's saved activations whatever
    the overflow (0: only what overflow teaches). Returns whether it is on.
    CMA_ACTIVATION_OFFLOAD=0 (off) or =MiB sets them at import."""
    from cma import torch_offload
    return torch_offload.configure(enabled, mib)


def staged_step(enabled=None, chunk_mib=None):
    """Oversubscription's staged optimizer step (torch_staged_step.py): its
    switch and chunk size in MiB; returns the settings.
    CMA_STAGED_STEP=0 (off) or =MiB sets them at import."""
    from cma import torch_staged_step
    return torch_staged_step.configure(enabled, chunk_mib)


def advise(tensor, read_mostly=False, preferred=None, accessed_by=()):
    """Advice for the tensor's allocation; withdrawn when it is freed."""
    ptr, _ = _owned_storage(tensor)
    if isinstance(preferred, (str, torch.device)):
        preferred = torch.device(preferred)
        preferred = "cpu" if preferred.type == "cpu" else _index(preferred)
    _lib.advise(ptr, read_mostly, preferred, tuple(accessed_by))


def memory_stats(device=None):
    """This allocator's statistics with PyTorch's keys, and the symmetric
    heaps' (symmetric_bytes.current, ...) beside them: one view per device."""
    return _lib.stats(-1 if device is None else _index(device))


def last_placement_error(device=None):
    """Why num_placement_errors last rose on the device (a placement hint
    the driver refused, a sleep that migrated because its copies into the
    pinned staging failed), or None."""
    return _lib.last_placement_error(_index(device))


def snapshot():
    """cma's own snapshot (arenas whole, placement per block);
    torch.cuda.memory._snapshot() gives PyTorch's format."""
    return _lib.snapshot()


def __getattr__(name):
    # cma.torch.symmetric, imported on first use (it needs torch.distributed).
    if name == "symmetric":
        from cma import torch_symmetric
        return torch_symmetric
    raise AttributeError(name)
