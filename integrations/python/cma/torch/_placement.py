"""Where cma's memory lives, asked in one place: the device a name means,
whether an allocation lives on the host (oversubscription), the host tier
that routes new allocations there, and the room left on a device."""
import torch

from cma import _lib


def index(device=None):
    """The CUDA device index `device` names: the current device for None or
    for "cuda" without an index, as PyTorch reads them."""
    if device is None:
        return torch.cuda.current_device()
    d = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if d.type != "cuda":
        raise ValueError(f"cma.torch: {device!r} is not a CUDA device")
    return torch.cuda.current_device() if d.index is None else d.index


def local(t):
    """The tensor that holds `t`'s elements on this process: a DTensor's
    local shard (FSDP2's parameters and their optimizer state are DTensors,
    whose own storage cannot be read), else `t` itself."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return t
    if type(t).__name__ == "DTensor" and hasattr(t, "to_local"):
        return t.to_local()
    return t


def storage_address(t):
    """The address of the storage holding `t`'s elements (a DTensor's local
    shard's), or None for a tensor with no storage of its own."""
    try:
        return local(t).untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def on_host(t, cache=None):
    """Whether the cma allocation that `t`'s data starts lives on the host;
    False for memory cma did not allocate (or a pointer inside an
    allocation). With `cache` (a dict), the answer is kept per (address,
    storage bytes): where an allocation lives is learnt once."""
    try:
        key = (t.data_ptr(), t.untyped_storage().nbytes()) if cache is not None else None
    except Exception:  # a tensor with no storage of its own (a subclass)
        return False
    if key is not None and key in cache:
        return cache[key]
    try:
        hit = bool(_lib.placed_on_host(t.data_ptr()))
    except Exception:  # not an allocation start cma knows
        hit = False
    if key is not None:
        cache[key] = hit
    return hit


class HostTier:
    """`with HostTier(device):` the device's allocations made inside (by
    any thread) live on the host (oversubscription)."""

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
    return HostTier(index(device))


def oversubscribed_devices(params):
    """The CUDA devices of `params` whose cma budget has a host part."""
    out = set()
    for p in params:
        if p.is_cuda and p.device.index not in out:
            if _lib.stats(p.device.index).get("host_budget_bytes", 0) > 0:
                out.add(p.device.index)
    return out


def state_incomplete(optimizer, params):
    """A step that creates state: the first, or one after parameters were added."""
    return any(len(optimizer.state.get(p, {})) == 0 for p in params if p.grad is not None)


def state_tiers(optimizer, params):
    """Host tiers to enter while a step creates state for `params` outside
    optimizer.step() (training/step_in_backward.py): where the global
    optimizer hooks (training/plan.py), or host_resident()'s, would route it."""
    if getattr(optimizer, "_cma_host_resident", False):
        devices = {p.device.index for p in params if p.is_cuda}
    else:
        devices = oversubscribed_devices(params)
    return [HostTier(d) for d in sorted(devices)]


def device_room(device):
    """What cma may still place on the device: its budget's device part less
    what it has handed out there (cudaMemGetInfo cannot tell: the pages cma
    discards stay counted as used)."""
    st = _lib.stats(device.index)
    device_budget = st.get("managed_budget_bytes", 0)  # (the host's part is apart)
    on_device = (st.get("allocated_bytes.all.current", 0) -
                 st.get("host_resident_bytes.all.current", 0))
    return device_budget - on_device - (256 << 20)
