"""Oversubscription's training plan: the global torch.optim hooks
(route_new_optimizer_state, installed by use_as_default()) route a new
optimizer's state to the host and attach the staged step (staged_step.py)
and the activation offload (offload.py) to every optimizer whose device is
oversubscribed. The hints of hints.py adjust it per optimizer; what each
optimizer carries: _cma_stager (the staging), _cma_host_resident
(host_resident()), _cma_in_backward (step_in_backward.py). staged_step and
offload are imported at their first use, as they read their environment
variables when imported.

The state goes to the host only as far as the device cannot keep it
(keep_state_that_fits): the first step makes it on the host; the next
step measures what a whole step needs of the device (its peak of live
device pages, a window of the allocator's own that the user's
reset_peak_memory_stats leaves alone: the first step's forward ran
without gradients, which a loop that zeroes them after the forward keeps
through the next forward); when it ends, as much of the state as fits
beside that peak is copied back to the device. So a model that fits pays
for the mode one copy of its state, once, and one slightly larger reads
only the rest over the link.
CMA_OPTIMIZER_STATE=host keeps all of it on the host (the placement of
earlier versions; host_resident() does the same per optimizer)."""
import os
import weakref

import torch

from cma import _lib
from cma.torch import _placement

_routing = False  # the global hooks are registered
# Device memory the kept state leaves free beyond the measured step's peak:
# later steps' layouts differ by a few edge pages, and what overflows then
# is an activation read over the link many times.
_STATE_MARGIN_BYTES = 256 << 20
_MARGIN_SHARE = 64  # and 1/64 of the device's part
_PAGE = 2 << 20


def _state_placement():
    v = os.environ.get("CMA_OPTIMIZER_STATE", "fit").strip().lower()
    if v not in ("fit", "host"):
        raise ValueError(f"cma.torch: CMA_OPTIMIZER_STATE={v!r}: use 'fit' (the default: on "
                         "the device as far as it fits) or 'host' (all of it on the host)")
    return v


def state_room(device, peak):
    """Bytes of optimizer state that device `device` can keep beside a step
    whose live device pages peaked at `peak` bytes (its budget's device part
    less the peak and a margin); 0 when none."""
    budget = _lib.stats(device).get("managed_budget_bytes", 0)
    return max(0, budget - peak - _STATE_MARGIN_BYTES - budget // _MARGIN_SHARE)


def keep_state_that_fits(opt, peaks):
    """Copies `opt`'s host-resident state back to the device, parameter by
    parameter in the optimizer's order, while it fits within
    state_room(device, peaks[device]); the entries are rebound to the copies
    (exact, queued on the current stream) and the host blocks freed in that
    stream's order. Returns {device: bytes kept}."""
    room = {d: state_room(d, peak) for d, peak in peaks.items()}
    kept = {d: 0 for d in peaks}
    seen = set()
    with torch.no_grad():
        for group in opt.param_groups:
            for p in group["params"]:
                state = opt.state.get(p)
                if not state:
                    continue
                for key, t in list(state.items()):
                    if not torch.is_tensor(t) or not t.is_cuda or t.device.index not in room:
                        continue
                    try:
                        whole = (t.storage_offset() == 0 and t.is_contiguous() and
                                 t.untyped_storage().nbytes() == t.numel() * t.element_size())
                    except Exception:  # a tensor with no storage of its own (a subclass)
                        whole = False
                    if not whole or t.data_ptr() in seen or not _placement.on_host(t):
                        continue
                    seen.add(t.data_ptr())
                    n = t.numel() * t.element_size()
                    cost = n + (_PAGE // 2 if n >= (1 << 20) else 0)  # its share of edge pages
                    d = t.device.index
                    if cost > room[d]:
                        continue
                    copy = torch.empty_like(t)
                    if _placement.on_host(copy):  # the device was fuller than the peak said
                        continue
                    copy.copy_(t)
                    state[key] = copy
                    room[d] -= cost
                    kept[d] += n
    return kept


def route_new_optimizer_state():
    """Oversubscription's default placement for training: every optimizer's
    state lives on the host as far as the device cannot keep it (updated
    by staged_step.py; keep_state_that_fits), and saved
    activations make room when a step overflows (offload.py). The state is touched once per step (the
    optimizer reads and writes it over the link), while parameters and
    activations are touched many times: they keep the device. Global
    torch.optim hooks route the allocations of a step that creates state
    (its first) to the host, and mark each step's end, so that the next
    step follows the plan learnt from the last (which of its allocations
    live on the host: CachingManagedAllocator::MarkIteration); without
    oversubscription they do nothing after one check per optimizer.
    Registered once per process (use_as_default() may be called again)."""
    global _routing
    _state_placement()  # a bad CMA_OPTIMIZER_STATE fails here, not at a step
    if _routing:
        return
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    _routing = True
    known = weakref.WeakKeyDictionary()  # optimizer -> devices with a host part, or ()
    entered = []
    # Optimizer -> devices: a step that creates state, then the step that
    # measures how much of it the devices keep.
    creating = weakref.WeakKeyDictionary()
    measuring = weakref.WeakKeyDictionary()

    def before(opt, args, kwargs):
        params = [p for g in opt.param_groups for p in g["params"]]
        devices = known.get(opt)
        if devices is None:
            devices = known[opt] = tuple(sorted(_placement.oversubscribed_devices(params)))
            if devices:
                # Its host-resident state is updated staged from the next
                # step, and activations make room when a step overflows.
                from cma.torch.training import offload, staged_step
                staged_step.attach(opt)
                offload.watch(devices, params)
        if devices:  # the staging runs after the optimizer's own pre-hooks, also later ones
            from cma.torch.training import staged_step
            staged_step.order_last(opt)
        if devices and getattr(opt, "_cma_host_resident", False) is False and \
                _placement.state_incomplete(opt, params):
            if _state_placement() == "fit":
                creating[opt] = devices
            for d in devices:
                t = _placement.HostTier(d)
                t.__enter__()
                entered.append(t)

    def after(opt, args, kwargs):
        while entered:
            entered.pop().__exit__(None, None, None)
        measured = measuring.pop(opt, None)
        if measured:
            keep_state_that_fits(opt, {d: _lib.take_live_peak(d) for d in measured})
        made = creating.pop(opt, None)
        if made:
            for d in made:
                _lib.take_live_peak(d)  # the window starts with the next step
            measuring[opt] = made
        # A step ends an iteration: the next follows the plan learnt from it.
        devices = known.get(opt, ())
        if devices:
            from cma.torch.training import offload
            offload.end_step(devices)
        for d in devices:
            _lib.mark_iteration(d)

    register_optimizer_step_pre_hook(before)
    register_optimizer_step_post_hook(after)
