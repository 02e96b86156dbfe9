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
to None. The side stream belongs to a green context of `sms` SMs where
torch offers one (torch.cuda.green_contexts): update kernels that read the
host over the link hold their SMs while they wait, and on all SMs they
slowed backward's memory-bound kernels several times over (measured, see
bench/results/h200_oversub_inbwd/); sms=0, or a torch without green
contexts, uses an ordinary stream. When backward ends, the caller's streams
wait for the side stream (autograd runs its end callbacks on them), so what
the caller queues after backward sees the updated parameters; the caller's
`optimizer.step()` waits again (before and after the step itself: a
closure's backward runs inside it) and updates only parameters whose
gradient came some other way.
Only elementwise optimizers qualify (torch.optim's Adam, AdamW, SGD,
Adagrad, RMSprop, Adamax, NAdam, RAdam): their update of one parameter
reads that parameter's gradient and state alone, so the update is the same
kernel on the same values as the whole step's: bit-identical.

Contract: what changes for the caller is when gradients exist: after
backward they are None (applied already). So these cannot be combined with
it, and are refused loudly rather than silently ignored where the hint can
see them: gradient accumulation over several backward passes (the second
backward reaching a parameter before optimizer.step() raises RuntimeError
and leaves that gradient unset; the first's updates stand), clipping
(torch.nn.utils.clip_grad_norm_ and clip_grad_value_, looked up at call
time, raise when given an updated parameter; a name imported before the
hint, or torch's lower-level norm helpers, are not caught), GradScaler
(its scale() raises while a hint is attached) and data parallelism (refused
at attach while torch.distributed is initialised: gradients would be
applied before their all-reduce). Sparse gradients are left for
optimizer.step(). With zero_grad(set_to_none=False), a parameter that a
backward does not reach is not updated, where a plain loop would apply its
zero gradient (weight decay, momentum). Hyperparameters (a scheduler's lr)
are read when each bucket is applied: change them between optimizer.step()
and the next backward, as schedulers do. State made in backward (the first
step's) follows oversubscription's placement (the host), except the state
of the bucket applied last in the first backward, which overlaps nothing:
after that backward it moves to the device where the device's part had
room for it at its peak (tail_state_bytes(opt) says how much). The hint
holds its optimizer weakly: an optimizer that is gone leaves its hooks
inert, and a parameter can carry the hint of one live optimizer only
(ValueError).
Thread safety: backward's hooks run on autograd's threads (one per device)
under one lock per optimizer; the optimizer itself is not thread-safe, as
torch.optim is not.
"""
import threading
import weakref

import torch

from cma import torch_staged_step

_ELEMENTWISE = torch_staged_step._ELEMENTWISE
_DEFAULT_SMS = 8  # on an H200, 8 SMs kept the link full (16 and 32 were slower)
_green = {}  # (device, sms) -> (green context, side stream), shared by optimizers
_green_errors = {}  # (device, sms) -> why no green context was made
_live = []  # weak references to attached states, for the guards


class _InBackward:
    def __init__(self, opt, bucket_bytes, sms):
        self._opt = weakref.ref(opt, self._on_opt_gone)
        self.bucket_bytes = bucket_bytes
        self.sms = sms
        self.raw_step = torch_staged_step._unhooked(type(opt).step)
        self.lock = threading.RLock()
        self.group_index = {}  # id(param) -> index of its group
        self.pending = {}  # id(param) -> param with a final gradient, not yet applied
        self.pending_bytes = 0
        self.applied = set()  # ids applied since the last optimizer.step()
        self.ready = {}  # (device, stream id) -> (stream, event after the last final gradient)
        self.side = {}  # device index -> side stream
        self.side_sms = {}  # device index -> SMs of its green context, or None (all)
        self.end_queued = False
        self.handles = []
        self.buckets = 0  # buckets applied, for tests and benchmarks
        self.last_bucket = []  # the parameters applied last (their update overlaps nothing)
        self.tail_placed = False  # whether the last bucket's state placement was decided
        self.tail_state_bytes = 0  # bytes of it brought to the device

    def opt(self):
        """The optimizer while it lives and still carries this hint."""
        o = self._opt()
        return o if o is not None and getattr(o, "_cma_in_backward", None) is self else None

    def _on_opt_gone(self, _ref):
        for h in self.handles:
            h.remove()
        self.handles = []

    # ------------------------------------------------------------ backward
    def on_grad(self, p):
        with self.lock:
            if self.opt() is None or p.grad is None:
                return
            if id(p) in self.applied:
                p.grad = None  # refused: nothing of this backward is applied
                raise RuntimeError(
                    "cma.torch.step_in_backward: a second backward reached a parameter "
                    f"{tuple(p.shape)} before optimizer.step(); its first gradient was applied "
                    "already, so gradients cannot accumulate over backward passes (call "
                    "optimizer.step() after each backward, or drop the hint)")
            if p.grad.is_sparse:
                return  # left for optimizer.step()
            stream = torch.cuda.current_stream(p.device)
            key = (p.device.index, stream.stream_id)
            entry = self.ready.get(key)
            if entry is None:
                entry = self.ready[key] = (stream, torch.cuda.Event())
            entry[1].record(stream)
            if id(p) not in self.pending:
                self.pending[id(p)] = p
                self.pending_bytes += p.numel() * p.element_size()
            if not self.end_queued:
                self.end_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self.on_backward_end)
            if self.pending_bytes >= self.bucket_bytes:
                self.apply_pending()

    def on_backward_end(self):
        # Runs on the caller's streams (autograd's post-processing): they wait
        # for the updates, so what the caller queues between backward and
        # step() (an EMA, a norm, a checkpoint) reads the updated parameters.
        with self.lock:
            self.end_queued = False
            self.apply_pending()
            for device, side in self.side.items():
                torch.cuda.current_stream(device).wait_stream(side)
                for (d, _), (stream, _) in self.ready.items():
                    if d == device:
                        stream.wait_stream(side)

    def apply_pending(self):
        with self.lock:
            params = [p for p in self.pending.values() if p.grad is not None]
            self.pending, self.pending_bytes = {}, 0
            opt = self.opt()
            if not params or opt is None:
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
                    self._step(opt, ps)
                for p, g in zip(ps, grads):
                    g.record_stream(side)  # its memory returns after the update
                    p.grad = None
                    self.applied.add(id(p))
            self.buckets += 1
            self.last_bucket = params

    def _step(self, opt, params):
        """The class's own step over `params` alone, each in its own group's
        hyperparameters; new state routed as a whole step's would be."""
        from cma import torch as cmat
        groups = {}
        for p in params:
            groups.setdefault(self.group_index[id(p)], []).append(p)
        saved = opt.param_groups
        tiers = []
        try:
            if cmat._state_incomplete(opt, params):
                tiers = cmat._state_tiers(opt, params)
            for t in tiers:
                t.__enter__()
            opt.param_groups = [dict(saved[i], params=ps) for i, ps in groups.items()]
            stager = getattr(opt, "_cma_stager", None)
            if stager is not None and torch_staged_step._settings["enabled"] and stager.run():
                stager.held_grads = None  # applied: nothing to hand back
            else:
                self.raw_step(opt)
        finally:
            opt.param_groups = saved
            while tiers:
                tiers.pop().__exit__(None, None, None)

    def _side(self, device):
        s = self.side.get(device)
        if s is None:
            s, self.side_sms[device] = _side_stream(device, self.sms)
            self.side[device] = s
        return s

    # --------------------------------------------------- optimizer.step()
    def catch_up(self):
        """The current streams wait for the side streams: what the caller
        queues next sees every update applied so far."""
        with self.lock:
            # A backward that raised never ran its end callback: its pending
            # parameters are applied here, and the next backward queues anew.
            self.end_queued = False
            self.apply_pending()
            for device, side in self.side.items():
                torch.cuda.current_stream(device).wait_stream(side)

    def before_step(self):
        with self.lock:
            self.catch_up()
            self.applied.clear()
            opt = self.opt()
            if not self.tail_placed and opt is not None and self.last_bucket:
                self.tail_placed = True
                self.tail_state_bytes = _tail_to_device(opt, self.last_bucket, self._side)


def _tail_to_device(opt, params, side_of):
    """After the first backward: the state of the bucket applied last (the
    parameters whose gradient is final last, such as a tied embedding) is
    updated after backward has ended, so over the link it adds its time to
    every step. It moves to the device where the device's part kept room
    for it at its populated peak, with 256 MiB to spare and, for a step the
    staging will serve from the next one on, its two chunk buffers; returns
    the bytes moved. An explicit host_resident() hint wins. The copies are
    made on the side stream that updates them (`side_of(device)`), so they
    belong to its pool as the host copies did."""
    from cma import _lib
    if getattr(opt, "_cma_host_resident", False):
        return 0
    parts = []
    for p in params:
        for k, t in opt.state.get(p, {}).items():
            if torch.is_tensor(t) and t.is_cuda and t.numel() * t.element_size() >= \
                    torch_staged_step._MIN_STAGED_BYTES and _placed_on_host(t):
                parts.append((p, k, t))
    need = sum(t.numel() * t.element_size() for _, _, t in parts)
    if not need:
        return 0
    spare = 256 << 20
    staged = torch_staged_step._settings["enabled"] and \
        not all(g.get("fused") for g in opt.param_groups)
    if staged:
        spare += 2 * (torch_staged_step._settings["chunk_mib"] << 20)
    for device in {t.device.index for _, _, t in parts}:
        st = _lib.stats(device)
        budget = st.get("managed_budget_bytes", 0)
        if budget - st.get("reserved_bytes.all.peak", budget) < need + spare:
            return 0
    moved = 0
    for p, k, t in parts:
        side = side_of(t.device.index)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            new = torch.empty_like(t)
            if _placed_on_host(new):
                continue  # no room after all: the host copy stays
            new.copy_(t)
        opt.state[p][k] = new  # the host copy is freed in the side stream's order
        moved += t.numel() * t.element_size()
    for device in {t.device.index for _, _, t in parts}:
        torch.cuda.current_stream(device).wait_stream(side_of(device))
    return moved


def _placed_on_host(t):
    from cma import _lib
    try:
        return bool(_lib.placed_on_host(t.data_ptr()))
    except Exception:  # not an allocation cma knows (PyTorch's own allocator)
        return False


def _side_stream(device, sms):
    """(stream, SMs it may use or None for all): from a green context of
    `sms` SMs when torch offers them, else an ordinary stream."""
    if sms:
        hit = _green.get((device, sms))
        if hit is None:
            try:
                from torch.cuda import green_contexts
                # By keyword: torch 2.11 takes (num_sms, device_id), later
                # releases keywords only.
                ctx = green_contexts.GreenContext.create(num_sms=sms, device_id=device)
                g = ctx.Stream()
                s = torch.cuda.Stream(stream_id=g.stream_id, device_index=g.device_index,
                                      device_type=g.device_type)
                hit = _green[(device, sms)] = (ctx, s)
            except (ImportError, AttributeError, RuntimeError, TypeError) as e:
                # Not offered (older torch, ROCm, no driver support): all SMs,
                # and side_stream_sms() says None; the reason is kept.
                _green_errors[(device, sms)] = f"{type(e).__name__}: {e}"
                hit = _green[(device, sms)] = (None, None)
        if hit[1] is not None:
            return hit[1], sms
    return torch.cuda.Stream(device=device), None


def attach(opt, bucket_mib=64, sms=_DEFAULT_SMS):
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
    if int(bucket_mib) <= 0 or int(sms) < 0:
        raise ValueError("cma.torch.step_in_backward: bucket_mib must be positive and sms "
                         f"non-negative, not {bucket_mib} and {sms}")
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        raise ValueError("cma.torch.step_in_backward: torch.distributed is initialised; with "
                         "data parallelism each gradient would be applied before its all-reduce")
    state = _InBackward(opt, int(bucket_mib) << 20, int(sms))
    if state.raw_step is None:
        raise ValueError("cma.torch.step_in_backward: the optimizer class's step has no "
                         "unhooked form")
    taken = _hinted_ids()
    params = []
    for i, group in enumerate(opt.param_groups):
        if group.get("differentiable"):
            raise ValueError("cma.torch.step_in_backward: a differentiable parameter group "
                             "cannot be stepped inside backward")
        for p in group["params"]:
            if not p.is_cuda:
                raise ValueError("cma.torch.step_in_backward: a parameter is not a CUDA "
                                 f"tensor ({tuple(p.shape)} on {p.device})")
            if id(p) in taken:
                raise ValueError("cma.torch.step_in_backward: a parameter "
                                 f"{tuple(p.shape)} carries another live optimizer's hint "
                                 "(remove it with step_in_backward(other, False))")
            if p.requires_grad and id(p) not in state.group_index:
                state.group_index[id(p)] = i
                params.append(p)
    for p in params:
        state.handles.append(p.register_post_accumulate_grad_hook(state.on_grad))
    state.handles.append(opt.register_step_pre_hook(lambda o, a, k: state.before_step()))
    # First among this optimizer's pre-hooks (torch's global ones run before
    # them): the staging's and the caller's see the streams caught up.
    hooks = getattr(opt, "_optimizer_step_pre_hooks", None)
    if hasattr(hooks, "move_to_end"):
        hooks.move_to_end(state.handles[-1].id, last=False)
    # After the step too: a closure's backward runs inside it.
    state.handles.append(opt.register_step_post_hook(lambda o, a, k: state.catch_up()))
    opt._cma_in_backward = state
    _live.append(weakref.ref(state))
    _install_guards()
    return opt


def detach(opt):
    """Removes the hint: gradients stay for optimizer.step() from the next
    backward on. Whatever was applied already stays applied."""
    state = getattr(opt, "_cma_in_backward", None)
    if state is None:
        return opt
    state.before_step()
    for h in state.handles:
        h.remove()
    state.handles = []
    opt._cma_in_backward = None
    return opt


def buckets_applied(opt):
    """How many buckets `opt` applied inside backward (0 without the hint)."""
    s = getattr(opt, "_cma_in_backward", None)
    return 0 if s is None else s.buckets


def tail_state_bytes(opt):
    """Bytes of optimizer state the hint brought to the device (the last
    bucket's, see _tail_to_device)."""
    s = getattr(opt, "_cma_in_backward", None)
    return 0 if s is None else s.tail_state_bytes


def side_stream_sms(opt):
    """{device: SMs its side stream may use, None for all} (empty before the
    first backward or without the hint; why a green context could not be
    made: torch_step_in_backward._green_errors)."""
    s = getattr(opt, "_cma_in_backward", None)
    return {} if s is None else dict(s.side_sms)


def _states():
    out = []
    for ref in list(_live):
        s = ref()
        if s is None or s.opt() is None:
            _live.remove(ref)
        else:
            out.append(s)
    return out


def _hinted_ids():
    return {i for s in _states() for i in s.group_index}


def _install_guards():
    """What would silently do nothing, or the wrong thing, once gradients are
    applied in backward is refused while a hint is attached: clipping an
    updated parameter, and GradScaler's scaling."""
    import torch.nn.utils as nn_utils
    from torch.nn.utils import clip_grad
    if getattr(nn_utils.clip_grad_norm_, "_cma_guarded", False):
        return

    def guarded(original):
        def clip(parameters, *args, **kwargs):
            ps = [parameters] if torch.is_tensor(parameters) else list(parameters)
            applied = {i for s in _states() for i in s.applied}
            hit = [p for p in ps if id(p) in applied]
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

    scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
    if scaler is not None:
        original_scale = scaler.scale

        def scale(self, outputs):
            if self.is_enabled() and _states():
                raise RuntimeError(
                    "GradScaler.scale: cma.torch.step_in_backward applies gradients during "
                    "backward, before the scaler could unscale or skip them; use bf16 autocast "
                    "(no scaler) or drop the hint")
            return original_scale(self, outputs)
        scale.__doc__ = original_scale.__doc__
        scaler.scale = scale
