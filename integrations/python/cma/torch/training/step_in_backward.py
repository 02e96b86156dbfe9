"""The optimizer's step during backward: an opt-in hint for training beyond
the GPU's memory (cma.torch.step_in_backward(optimizer)).

Why: with the optimizer's state on the host (oversubscription's placement)
the step is bound by the link (a fused AdamW over 7.3 GB of state: 0.175 s
on an H200), while backward is bound by the SMs. Run during backward, each
parameter's update overlaps the backward of the layers before it.

How: a post-accumulate-grad hook on every parameter collects those whose
gradient is final; every `bucket_mib` of them (and the rest when backward
ends) are updated by the optimizer class's own step, restricted to them, in
the hyperparameters of the group each is in then, on a side stream (a green
context of `sms` SMs where torch offers one) that first waits for the
gradients. A full bucket is applied at the next parameter's hook or at
backward's end, after the hooks registered behind this one. At backward's
end the caller's streams wait for the side stream; optimizer.step() waits
again and updates only what came some other way. Only elementwise
optimizers qualify (torch.optim's Adam, AdamW, SGD, Adagrad, RMSprop,
Adamax, NAdam, RAdam): the update of a parameter reads its gradient and
state alone, so it is bit-identical to the whole step's.

Contract (issue 47, stated in full in docs/pytorch.md): a loop gives the
plain loop's result, or raises naming the fix. Gradients stay readable after
backward (free_grads=True frees each once applied). The first _PROBE_STEPS
steps are plain and checked, so a loop the hint cannot serve (hyperparameters
or gradients changed between backward and step, a second backward, a
discarded backward) raises before anything changed; later the same misuse
raises one update late (the residual). torch.distributed, clipping and
GradScaler are refused before anything of a backward is applied; param
groups rebuilt between steps are followed. Parameters are updated in place
on a side stream that the caller's streams wait for at backward's end.
"""
import weakref

import torch
import torch.nn.utils as nn_utils
from torch.nn.utils import clip_grad

from cma.torch import _patches
from cma.torch.training._in_backward import _DROP, _NAME, _InBackward, _distributed, _shape
from cma.torch.training._optim import ELEMENTWISE

_DEFAULT_SMS = 8  # on an H200, 8 SMs kept the link full (16 and 32 were slower)
_live = []  # weak references to attached states, for the guards


def attach(opt, bucket_mib=64, sms=_DEFAULT_SMS, free_grads=False):
    """Installs the hint on `opt`; see cma.torch.step_in_backward."""
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"{_NAME}: {type(opt).__name__} is not a torch.optim.Optimizer")
    if getattr(opt, "_cma_in_backward", None) is not None:
        return opt
    if type(opt) not in ELEMENTWISE:
        raise ValueError(
            f"{_NAME}: {type(opt).__name__}'s update of a parameter may read others (only "
            "torch.optim's " + ", ".join(c.__name__ for c in ELEMENTWISE) + " qualify)")
    if int(bucket_mib) <= 0 or int(sms) < 0:
        raise ValueError(f"{_NAME}: bucket_mib must be positive and sms non-negative, not "
                         f"{bucket_mib} and {sms}")
    if _distributed():
        raise ValueError(f"{_NAME}: torch.distributed is initialised; with data parallelism "
                         "each gradient would be applied before its all-reduce")
    state = _InBackward(opt, int(bucket_mib) << 20, int(sms), bool(free_grads))
    if state.raw_step is None:
        raise ValueError(f"{_NAME}: the optimizer class's step has no unhooked form")
    taken = _hinted_ids()
    params = []
    for group in opt.param_groups:
        if group.get("differentiable"):
            raise ValueError(f"{_NAME}: a differentiable parameter group cannot be stepped "
                             "inside backward")
        for p in group["params"]:
            if not p.is_cuda:
                raise ValueError(f"{_NAME}: a parameter is not a CUDA tensor ({_shape(p)} on "
                                 f"{p.device})")
            if id(p) in taken:
                raise ValueError(f"{_NAME}: a parameter {_shape(p)} carries another live "
                                 "optimizer's hint (remove it with step_in_backward(other, False))")
            if p.requires_grad and id(p) not in state.hooked:
                state.hooked.add(id(p))
                params.append(p)
    for p in params:
        state.handles.append(p.register_post_accumulate_grad_hook(state.on_grad))
    first = opt.register_step_pre_hook(lambda o, a, k: state.first_pre_hook())
    last = opt.register_step_pre_hook(lambda o, a, k: state.last_pre_hook())
    state.first_id, state.last_id = first.id, last.id
    state.handles += [first, last, opt.register_step_post_hook(lambda o, a, k: state.post_hook())]
    state.order_hooks(opt)
    _wrap_zero_grad(opt)
    opt._cma_in_backward = state
    _live.append(weakref.ref(state))
    _install_guards()
    return opt


def _wrap_zero_grad(opt):
    """optimizer.zero_grad() first asks the hint (a discarded backward is
    refused); the optimizer is reached weakly, so no cycle is made."""
    prev = opt.__dict__.get("zero_grad")
    if getattr(prev, "_cma_in_backward", False):
        return
    ref, cls_zero = weakref.ref(opt), type(opt).zero_grad

    def zero_grad(*args, **kwargs):
        o = ref()
        s = getattr(o, "_cma_in_backward", None)
        if s is not None:
            s.before_zero_grad(kwargs.get("set_to_none", args[0] if args else True))
        return prev(*args, **kwargs) if prev is not None else cls_zero(o, *args, **kwargs)
    zero_grad._cma_in_backward = True
    zero_grad._cma_prev = prev
    zero_grad.__doc__ = cls_zero.__doc__
    opt.zero_grad = zero_grad


def detach(opt):
    """Removes the hint: gradients stay for optimizer.step() from the next
    backward on. Whatever was applied already stays applied."""
    state = getattr(opt, "_cma_in_backward", None)
    if state is None:
        return opt
    with state.lock:
        state._join()
        for p, g in state.hidden:
            if p.grad is None:
                p.grad = g
        state.hidden, state.pending, state.pending_bytes, state.full = [], {}, {}, set()
        state.reached, state.noted, state.applied, state.in_step = {}, {}, set(), False
    for h in state.handles:
        h.remove()
    state.handles = []
    z = opt.__dict__.get("zero_grad")
    if getattr(z, "_cma_in_backward", False):
        if z._cma_prev is None:
            del opt.zero_grad
        else:
            opt.zero_grad = z._cma_prev
    opt._cma_in_backward = None
    return opt


def buckets_applied(opt):
    """How many buckets `opt` applied inside backward (0 without the hint)."""
    s = getattr(opt, "_cma_in_backward", None)
    return 0 if s is None else s.buckets


def probe_steps_left(opt):
    """How many plain, checked steps remain before backward applies updates."""
    s = getattr(opt, "_cma_in_backward", None)
    return 0 if s is None else s.probe_left


def tail_state_bytes(opt):
    """Bytes of optimizer state the hint brought to the device (the last
    bucket's, see _tail_to_device)."""
    s = getattr(opt, "_cma_in_backward", None)
    return 0 if s is None else s.tail_state_bytes


def side_stream_sms(opt):
    """{device: SMs its side stream may use, None for all} (empty before the
    first applying backward or without the hint)."""
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
    return {i for s in _states() for i in s.hooked}


def _install_guards():
    """What would silently do nothing, or the wrong thing, once gradients are
    applied in backward is refused while a hint is attached: clipping a
    parameter a backward reached since the last step, and GradScaler's
    scaling (cma/torch/_patches.py keeps the originals)."""
    for patch in _GUARDS:
        patch.install()


def _guarded_clip(original):
    if getattr(original, "_cma_guarded", False):
        return None

    def clip(parameters, *args, **kwargs):
        ps = [parameters] if torch.is_tensor(parameters) else list(parameters)
        states = [s for s in _states() if not s.in_step]
        hit = [p for p in ps if any(id(p) in s.reached for s in states)]
        if hit:
            probing = all(s.probing for s in states if any(id(p) in s.reached for p in hit))
            raise RuntimeError(
                f"{original.__name__}: {len(hit)} parameter(s) are updated during backward "
                f"by {_NAME} ({'not yet: its first steps are checked, nothing changed' if probing else 'already'}), "
                "before their gradients could be clipped; clipping cannot be combined "
                f"with the hint: {_DROP}")
        return original(ps, *args, **kwargs)
    clip._cma_guarded = True
    clip.__name__ = original.__name__
    clip.__doc__ = original.__doc__
    return clip


def _guarded_scale(original_scale):
    if getattr(original_scale, "_cma_guarded", False):
        return None

    def scale(self, outputs):
        if self.is_enabled() and _states():
            raise RuntimeError(
                f"GradScaler.scale: {_NAME} applies gradients during backward, before the "
                "scaler could unscale or skip them; use bf16 autocast (no scaler) or drop "
                "the hint")
        return original_scale(self, outputs)
    scale._cma_guarded = True
    scale.__doc__ = original_scale.__doc__
    return scale


def _guarded_module_zero_grad(original):
    if getattr(original, "_cma_guarded", False):
        return None

    def zero_grad(self, set_to_none=True):
        # free_grads=True: a gradient applied in backward is gone, so zeroing
        # in place would skip a parameter the backward did not reach; the
        # optimizer's zero_grad refuses it, and so does the module's.
        if not set_to_none:
            states = [s for s in _states() if s.free_grads]
            if states:
                mine = {id(p) for p in self.parameters()}
                for s in states:
                    if mine & set(s.hooked):
                        s.before_zero_grad(False)
        return original(self, set_to_none)
    zero_grad._cma_guarded = True
    zero_grad.__doc__ = original.__doc__
    return zero_grad


def _clip_targets(name):
    # torch.nn.utils re-exports clip_grad's functions: both names are guarded.
    return lambda: [(clip_grad, name), (nn_utils, name)]


_GUARDS = (
    _patches.register("torch.nn.utils.clip_grad_norm_", _clip_targets("clip_grad_norm_"),
                      _guarded_clip),
    _patches.register("torch.nn.utils.clip_grad_value_", _clip_targets("clip_grad_value_"),
                      _guarded_clip),
    _patches.register("torch.nn.Module.zero_grad", lambda: [(torch.nn.Module, "zero_grad")],
                      _guarded_module_zero_grad),
    _patches.register("torch.amp.GradScaler.scale",
                      lambda: [(getattr(getattr(torch, "amp", None), "GradScaler", None),
                                "scale")],
                      _guarded_scale),
)
