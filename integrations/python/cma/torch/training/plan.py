"""Oversubscription's training plan: the global torch.optim hooks
(route_new_optimizer_state, installed by use_as_default()) route a new
optimizer's state to the host and attach the staged step (staged_step.py)
and the activation offload (offload.py) to every optimizer whose device is
oversubscribed. The hints of hints.py adjust it per optimizer; what each
optimizer carries: _cma_stager (the staging), _cma_host_resident
(host_resident()), _cma_in_backward (step_in_backward.py). staged_step and
offload are imported at their first use, as they read their environment
variables when imported."""
import weakref

from cma import _lib
from cma.torch import _placement

_routing = False  # the global hooks are registered


def route_new_optimizer_state():
    """Oversubscription's default placement for training: every optimizer's
    state lives on the host (updated by staged_step.py), and saved
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
    if _routing:
        return
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    _routing = True
    known = weakref.WeakKeyDictionary()  # optimizer -> devices with a host part, or ()
    entered = []

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
            for d in devices:
                t = _placement.HostTier(d)
                t.__enter__()
                entered.append(t)

    def after(opt, args, kwargs):
        while entered:
            entered.pop().__exit__(None, None, None)
        # A step ends an iteration: the next follows the plan learnt from it.
        devices = known.get(opt, ())
        if devices:
            from cma.torch.training import offload
            offload.end_step(devices)
        for d in devices:
            _lib.mark_iteration(d)

    register_optimizer_step_pre_hook(before)
    register_optimizer_step_post_hook(after)
