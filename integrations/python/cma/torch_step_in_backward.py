"""The optimizer's step during backward: an opt-in hint for training beyond
the GPU's memory (cma.torch.step_in_backward(optimizer)).

Why: with the optimizer's state on the host (oversubscription's placement),
the step is bound by the link (a fused AdamW over 7.3 GB of state: 0.175 s
on an H200, as long as the forward pass), while backward is bound by the
SMs. Run during backward, each parameter's update overlaps the backward of
the layers before it, and its gradient is freed as soon as it is applied,
so gradients never all live at once: the memory they took is the
activations' and the overflow's.

How: a post-accumulate-grad hook on every parameter collects those whose
gradient is final; every `bucket_mib` of them (and the rest when backward
ends) are updated by the optimizer class's own step, restricted to them,
on a side stream that first waits for the gradients; each gradient is then
released (its memory returns once the side stream is done with it) and set
to None. The caller's `optimizer.step()` makes the current stream wait for
the side stream and updates only parameters whose gradient came some other
way. Only elementwise optimizers qualify (torch.optim's Adam, AdamW, SGD,
Adagrad, RMSprop, Adamax, NAdam, RAdam): their update of one parameter reads
that parameter's gradient and state alone, so the update is the same kernel
on the same values as the whole step's: bit-identical.

Contract: what changes for the caller is when gradients exist: after
backward they are None (applied already), so gradient clipping, gradient
accumulation over several backward passes and GradScaler cannot be used
with it. Each is refused loudly rather than silently ignored: a second
backward reaching a parameter before optimizer.step() raises RuntimeError
(its first update has happened), torch.nn.utils.clip_grad_norm_ and
clip_grad_value_ raise when given such a parameter after its update, and
GradScaler.step finds no gradient to unscale (its own assertion). Hyper-
parameters (a scheduler's lr) are read when each bucket is applied: change
them between optimizer.step() and the next backward, as schedulers do.
State made in backward (the first step's) follows oversubscription's
placement (the host, as the optimizer hooks of cma.torch route it).
After optimizer.step() returns, everything queued on the current stream
sees the updated parameters. Not thread-safe per optimizer, as torch.optim
is not; backward's hooks run on autograd's thread while the caller waits.
"""
import weakref

import torch

from cma import torch_staged_step

_ELEMENTWISE = torch_staged_step._ELEMENTWISE


class _InBackward:
    def __init__(self, opt, bucket_bytes):
        self.opt = opt
        self.bucket_bytes = bucket_bytes
        self.raw_step = torch_staged_step._unhooked(type(opt).step)
        self.group_index = {}  # id(param) -> index of its group
        self.pending = []  # parameters with a final gradient, not yet applied
        self.pending_bytes = 0
        self.applied = set()  # ids applied since the last optimizer.step()
        self.ready = {}  # (device, stream id) -> (stream, event after the last final gradient)
        self.side = {}  # device index -> side stream
        self.end_queued = False
        self.handles = []
        self.buckets = 0  # buckets applied, for tests and benchmarks

    # ------------------------------------------------------------ backward
    def on_grad(self, p):
        if id(p) in self.applied:
            raise RuntimeError(
                "cma.torch.step_in_backward: a second backward reached a parameter "
                f"{tuple(p.shape)} before optimizer.step(); its first gradient was applied "
                "already, so gradients cannot accumulate over backward passes (call "
                "optimizer.step() after each backward, or drop the hint)")
        if p.grad is None:
            return
        if p.grad.is_sparse:
            raise RuntimeError("cma.torch.step_in_backward: sparse gradients are not "
                               f"supported (parameter {tuple(p.shape)})")
        stream = torch.cuda.current_stream(p.device)
        key = (p.device.index, stream.stream_id)
        entry = self.ready.get(key)
        if entry is None:
            entry = self.ready[key] = (stream, torch.cuda.Event())
        entry[1].record(stream)
        self.pending.append(p)
        self.pending_bytes += p.numel() * p.element_size()
        if not self.end_queued:
            self.end_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self.on_backward_end)
        if self.pending_bytes >= self.bucket_bytes:
            self.apply_pending()

    def on_backward_end(self):
        self.end_queued = False
        self.apply_pending()

    def apply_pending(self):
        params, self.pending, self.pending_bytes = self.pending, [], 0
        if not params:
            return
        by_device = {}
        for p in params:
            by_device.setdefault(p.device.index, []).append(p)
        for device, ps in by_device.items():
            side = self._side(device)
            for (d, _), (_, ev) in self.ready.items():
                if d == device:
                    side.wait_event(ev)
            grads = [p.grad for p in ps]
            with torch.cuda.stream(side):
                self._step(ps)
            for p, g in zip(ps, grads):
                g.record_stream(side)  # its memory returns after the update
                p.grad = None
                self.applied.add(id(p))
        self.buckets += 1

    def _step(self, params):
        """The class's own step over `params` alone, each in its own group's
        hyperparameters; new state routed as a whole step's would be."""
        from cma import torch as cmat
        groups = {}
        for p in params:
            groups.setdefault(self.group_index[id(p)], []).append(p)
        saved = self.opt.param_groups
        tiers = []
        try:
            if cmat._state_incomplete(self.opt, params):
                tiers = cmat._state_tiers(self.opt, params)
            for t in tiers:
                t.__enter__()
            self.opt.param_groups = [dict(saved[i], params=ps) for i, ps in groups.items()]
            stager = getattr(self.opt, "_cma_stager", None)
            if stager is not None and torch_staged_step._settings["enabled"] and stager.run():
                stager.held_grads = None  # applied: nothing to hand back
            else:
                self.raw_step(self.opt)
        finally:
            self.opt.param_groups = saved
            while tiers:
                tiers.pop().__exit__(None, None, None)

    def _side(self, device):
        s = self.side.get(device)
        if s is None:
            s = self.side[device] = torch.cuda.Stream(device=device)
        return s

    # --------------------------------------------------- optimizer.step()
    def before_step(self):
        # A backward that raised never ran its end callback: its pending
        # parameters are applied here, and the next backward queues anew.
        self.end_queued = False
        self.apply_pending()
        for device, side in self.side.items():
            torch.cuda.current_stream(device).wait_stream(side)
        self.applied.clear()


def attach(opt, bucket_mib=64):
    """Installs the hint on `opt`; see cma.torch.step_in_backward."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"cma.torch.step_in_backward: {type(opt).__name__} is not a "
                        "torch.optim.Optimizer")
    if getattr(opt, "_cma_in_backward", None) is not None:
        return opt
    if type(opt) not in _ELEMENTWISE:
        raise ValueError(
            f"cma.torch.step_in_backward: {type(opt).__name__}'s update of a parameter may "
            "read others (only torch.optim's " +
            ", ".join(c.__name__ for c in _ELEMENTWISE) + " qualify)")
    if int(bucket_mib) <= 0:
        raise ValueError(f"cma.torch.step_in_backward: bucket_mib must be positive, not "
                         f"{bucket_mib}")
    state = _InBackward(opt, int(bucket_mib) << 20)
    if state.raw_step is None:
        raise ValueError("cma.torch.step_in_backward: the optimizer class's step has no "
                         "unhooked form")
    params = []
    for i, group in enumerate(opt.param_groups):
        if group.get("differentiable"):
            raise ValueError("cma.torch.step_in_backward: a differentiable parameter group "
                             "cannot be stepped inside backward")
        for p in group["params"]:
            if not p.is_cuda:
                raise ValueError("cma.torch.step_in_backward: a parameter is not a CUDA "
                                 f"tensor ({tuple(p.shape)} on {p.device})")
            if p.requires_grad and id(p) not in state.group_index:
                state.group_index[id(p)] = i
                params.append(p)
    for p in params:
        state.handles.append(p.register_post_accumulate_grad_hook(state.on_grad))
    state.handles.append(opt.register_step_pre_hook(lambda o, a, k: state.before_step()))
    # First among the pre-hooks: the staging's and the caller's see the
    # stream caught up.
    hooks = getattr(opt, "_optimizer_step_pre_hooks", None)
    if hasattr(hooks, "move_to_end"):
        hooks.move_to_end(state.handles[-1].id, last=False)
    opt._cma_in_backward = state
    _live.append(weakref.ref(state))
    _guard_clipping()
    return opt


def detach(opt):
    """Removes the hint: gradients stay for optimizer.step() from the next
    backward on. Whatever was applied already stays applied."""
    state = getattr(opt, "_cma_in_backward", None)
    if state is None:
        return opt
    state.apply_pending()
    state.before_step()
    for h in state.handles:
        h.remove()
    opt._cma_in_backward = None
    return opt


def buckets_applied(opt):
    """How many buckets `opt` applied inside backward (0 without the hint)."""
    s = getattr(opt, "_cma_in_backward", None)
    return 0 if s is None else s.buckets


_live = []  # weak references to the attached states, for the clipping guard


def _applied(params):
    ids = set()
    for ref in list(_live):
        s = ref()
        if s is None:
            _live.remove(ref)
        elif s.opt._cma_in_backward is s:
            ids |= s.applied
    return [p for p in params if id(p) in ids]


def _guard_clipping():
    """Clipping after the update would silently do nothing: refuse it."""
    import torch.nn.utils as nn_utils
    from torch.nn.utils import clip_grad
    if getattr(nn_utils.clip_grad_norm_, "_cma_guarded", False):
        return

    def guarded(original):
        def clip(parameters, *args, **kwargs):
            ps = [parameters] if torch.is_tensor(parameters) else list(parameters)
            hit = _applied(ps)
            if hit:
                raise RuntimeError(
                    f"{original.__name__}: {len(hit)} parameter(s) were updated during backward "
                    "by cma.torch.step_in_backward, so their gradients are gone; clipping "
                    "cannot be combined with the hint")
            return original(ps, *args, **kwargs)
        clip._cma_guarded = True
        clip.__name__ = original.__name__
        clip.__doc__ = original.__doc__
        return clip

    for name in ("clip_grad_norm_", "clip_grad_value_"):
        g = guarded(getattr(clip_grad, name))
        setattr(clip_grad, name, g)
        setattr(nn_utils, name, g)
