"""The learned step's reporter (CMA_ALLOC_CONF learn_step:1).

The allocator learns the step and moves live allocations ahead of use
(allocator/learned_schedule.h): it records one step's allocations, frees and
uses, plans which allocations wait on the host and when they come back, and
replays the plan while the steps repeat. Allocations and frees it sees
itself; the uses come from here, through cma_note_uses: global module hooks
report what each module's forward reads (its own parameters and buffers,
its tensor inputs), a hook on its outputs' gradients what its backward
reads (the same tensors), and an optimizer's step its parameters,
gradients and state; the step ends with the optimizer's (cma_mark_iteration). Nothing
is decided here, and no tensor is held: only storage addresses.

install() registers the hooks once per process; use_as_default() calls it
when the configuration has learn_step:1, so that an unchanged training
script learns. Reports about memory cma does not own are ignored by it."""
from cma import _lib

_installed = False
_handles = []


def _storages(tensors, torch):
    """{device: [storage addresses]} of the CUDA tensors among `tensors`."""
    from cma.torch import _placement
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.is_cuda:
            where = _placement.storage_address(t)  # a DTensor's: its local shard's
            if where is not None:
                out.setdefault(t.device.index, []).append(where)
    return out


def _note(by_device, torch):
    for device, ptrs in by_device.items():
        _lib.note_uses(ptrs, torch.cuda.current_stream(device).cuda_stream, device)


def _module_tensors(module, args):
    tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    tensors.extend(a for a in args)
    return tensors


def install():
    """Registers the global hooks (once); returns whether they are on."""
    global _installed
    if _installed:
        return True
    import torch
    from torch.nn.modules.module import (register_module_forward_hook,
                                         register_module_forward_pre_hook)
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    def forward_pre(module, args):
        used = _storages(_module_tensors(module, args), torch)
        if used:
            _note(used, torch)
        return None

    def forward_post(module, args, output):
        # Its backward reads what its forward read: reported when the
        # gradient of its output arrives, before the backward kernels run.
        if not torch.is_grad_enabled():
            return None
        outs = output if isinstance(output, (tuple, list)) else (output,)
        target = next((o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad
                       and o.grad_fn is not None), None)
        if target is None:
            return None
        used = _storages(_module_tensors(module, args), torch)
        if not used:
            return None

        def backward_use(grad):
            _note(used, torch)
            return None

        target.register_hook(backward_use)
        return None

    def step_pre(opt, args, kwargs):
        # What an update reads and writes: each parameter, its gradient and
        # its optimizer state. Reported before the update's kernels run, so
        # one use must stand for what one kernel touches at once: a fused or
        # foreach implementation (the default on CUDA) updates a group's
        # tensors in one multi-tensor launch, so the group is one use (the
        # plan then brings it all back first and sends nothing in between,
        # which would run ahead of that launch); a for-loop implementation
        # (foreach=False) updates one parameter after another, one use each.
        # (State that oversubscription routed to the host counts nothing on
        # the device: the allocator knows it.)
        for g in opt.param_groups:
            # foreach None is the CUDA default of the optimizers that have
            # the key; one without it (LBFGS, SparseAdam, others') or a
            # differentiable one loops over its parameters.
            per_group = bool(g.get("fused")) or (
                "foreach" in g and g["foreach"] is not False and not g.get("differentiable"))
            group = []
            for p in g["params"]:
                if p.grad is None:  # the update skips it: no kernel reads it
                    continue
                tensors = [p, p.grad]
                tensors.extend(v for v in opt.state.get(p, {}).values()
                               if isinstance(v, torch.Tensor))
                if per_group:
                    group.extend(tensors)
                    continue
                used = _storages(tensors, torch)
                if used:
                    _note(used, torch)
            if group:
                used = _storages(group, torch)
                if used:
                    _note(used, torch)

    def step_post(opt, args, kwargs):
        # The step ends with the optimizer's (a device marked twice, here and
        # by oversubscription's own hook, records an empty step: a no-op).
        devices = {p.device.index for g in opt.param_groups for p in g["params"] if p.is_cuda}
        end_step(sorted(devices))

    _handles.append(register_module_forward_pre_hook(forward_pre))
    _handles.append(register_module_forward_hook(forward_post))
    _handles.append(register_optimizer_step_pre_hook(step_pre))
    _handles.append(register_optimizer_step_post_hook(step_post))
    _installed = True
    return True


def uninstall():
    """Removes the hooks (the allocator keeps what it learnt until the step changes)."""
    global _installed
    while _handles:
        _handles.pop().remove()
    _installed = False


def end_step(devices):
    """Ends the step on `devices` (the optimizer's post-hook does it)."""
    for d in devices:
        _lib.mark_iteration(d)


def enabled(conf=None):
    """Whether CMA_ALLOC_CONF (or `conf`) has learn_step:1: read from the
    text, since asking the allocator would create it (and CUDA's context)."""
    import os
    import re
    text = os.environ.get("CMA_ALLOC_CONF", "") if conf is None else conf
    return re.search(r"(^|,)\s*learn_step\s*:\s*1\s*(,|$)", text) is not None
