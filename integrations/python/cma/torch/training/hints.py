"""The training hints, one line each after building the optimizer
(re-exported by cma.torch): host_resident(), step_in_backward(), and the
switches of the staged step and the activation offload. Their modules are
imported at first use (they read their environment variables then, as
before cma.torch was a package)."""
import torch

from cma import _lib
from cma.torch import _placement


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
        where = _placement.storage_address(p) if p.is_cuda else None
        if where is None or _lib.device_of(where) is None:
            raise ValueError("cma.torch.host_resident: a parameter of the optimizer is not a "
                             f"CUDA tensor cma owns ({tuple(p.shape)} on {p.device})")
        devices.add(p.device.index)
    for p in params:  # state made by earlier steps
        for key, t in list(optimizer.state.get(p, {}).items()):
            if torch.is_tensor(t) and t.is_cuda and not _placement.on_host(t):
                with _placement.host_tier(t.device):
                    optimizer.state[p][key] = t.clone()
    tiers = [_placement.HostTier(d) for d in sorted(devices)]
    entered = []

    optimizer._cma_host_resident = True  # the global hook leaves it to these

    def before(opt, args, kwargs):
        # Only a step that creates state routes (the first, or one after
        # new parameters were added); later steps allocate on the device.
        if _placement.state_incomplete(opt, params):
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
    after backward). training/step_in_backward.py and docs/pytorch.md state
    the contract. TypeError for a non-optimizer, ValueError (nothing
    changed) for one whose update is not elementwise, a non-CUDA parameter,
    a differentiable group, a parameter hinted by another live optimizer,
    or torch.distributed initialised. enabled=False removes it. Returns the
    optimizer."""
    from cma.torch.training import step_in_backward as sib
    if not enabled:
        return sib.detach(optimizer)
    return sib.attach(optimizer, bucket_mib, sms, free_grads)


def activation_offload(enabled=None, mib=None):
    """Oversubscription's activation offload (training/offload.py): on or off
    for steps from now on (off, no hook of cma's stays installed); `mib`
    moves at least that many MiB of each step's saved activations whatever
    the overflow (0: only what overflow teaches). Returns whether it is on.
    CMA_ACTIVATION_OFFLOAD=0 (off) or =MiB sets them at import."""
    from cma.torch.training import offload
    return offload.configure(enabled, mib)


def staged_step(enabled=None, chunk_mib=None):
    """Oversubscription's staged optimizer step (training/staged_step.py): its
    switch and chunk size in MiB; returns the settings.
    CMA_STAGED_STEP=0 (off) or =MiB sets them at import."""
    from cma.torch.training import staged_step as staging
    return staging.configure(enabled, chunk_mib)
