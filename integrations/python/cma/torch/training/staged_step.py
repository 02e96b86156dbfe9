"""The staged optimizer step: oversubscription's way to update optimizer
state that lives on the host (cma.torch routes it there, see
plan.route_new_optimizer_state) at the link's full speed both ways.

Read in place over the link by the optimizer's kernel, the state moves at
the rate that kernel's loads and stores reach host memory (a fused AdamW
over 7.3 GB of state: about 22 GB/s each way on an H200). Staged, it
moves by copy kernels that keep the link busy both ways at once (the
copy engines, given both directions on two streams, took turns: 26 GB/s
each way there), a chunk at a time on the current stream: after chunk i's
update, one copy kernel stores chunk i to the host and loads chunk i+1
into the other of two device buffers of up to `chunk_mib` each (or the
largest parameter's state), which are freed when the step ends: at that
point the activations that need the memory are gone.

Each chunk is a slice of a parameter group updated by the optimizer's own
step (the class's step without its hooks, the group's hyperparameters, the
state dictionary's entries pointed at the staged copies), so the update is
the same kernel on the same values: bit-identical to the unstaged step.
Only optimizers whose update of a parameter reads nothing but that
parameter's gradient and state are staged (torch.optim's Adam, AdamW,
SGD, Adagrad, RMSprop, Adamax, NAdam, RAdam, exactly those classes);
others, a step given a closure, sparse gradients, fused or differentiable
groups, or too little free device memory for two chunks run as before
(reading the state over the link).

Contract: the staging runs as the optimizer's last step pre-hook: it is
appended when the optimizer is first seen, and cma.torch's global
pre-hook (which runs before every optimizer's own pre-hooks) moves it
back to the end at every step, so a pre-hook registered later (an LR
warmup, a gradient clip attached after the first step) still runs before
it and sees the gradients, as in a plain step. The optimizer's own step
then finds no gradient and does nothing, and a post-hook puts the
gradients back, so post-hooks and the caller see them as after any step.
The class's step must update each state entry in place (the eight classes
do); an entry it rebinds to a new tensor keeps that new value (on the
device), and the optimizer's later steps run unstaged. When the
step returns, the state's host copies are written in the current stream's
order (everything is queued on it). Not thread-safe per
optimizer, as torch.optim is not.

Environment: CMA_STAGED_STEP=0 turns it off; CMA_STAGED_STEP=MiB sets the
chunk size (default 256). configure() does the same at run time.
"""
import os

import torch

from cma.torch import _placement
from cma.torch.training._optim import ELEMENTWISE, unhooked

_MIN_STAGED_BYTES = 1 << 20  # smaller state (step counters) is read in place


def _settings_from_env():
    v = os.environ.get("CMA_STAGED_STEP", "").strip()
    if v in ("0", "off", "false"):
        return {"enabled": False, "chunk_mib": 256}
    chunk = int(v) if v.isdigit() and int(v) > 0 else 256
    return {"enabled": True, "chunk_mib": chunk}


_settings = _settings_from_env()


def configure(enabled=None, chunk_mib=None):
    """Sets the staged step's switch and chunk size (MiB) for steps from now
    on; returns the settings. A bad value raises ValueError and changes
    nothing."""
    new = dict(_settings)
    if enabled is not None:
        new["enabled"] = bool(enabled)
    if chunk_mib is not None:
        if int(chunk_mib) <= 0:
            raise ValueError(f"cma staged step: chunk_mib must be positive, not {chunk_mib}")
        new["chunk_mib"] = int(chunk_mib)
    _settings.update(new)
    return dict(_settings)


def _on_host(t, cache):
    """Whether `t` is a whole host-resident allocation of cma's. Where it
    lives is cached per allocation; the layout is checked every time (state
    made again by load_state_dict may reuse an address)."""
    try:
        if t.storage_offset() != 0 or not t.is_contiguous():
            return False
    except Exception:  # a tensor with no storage of its own (a subclass)
        return False
    return _placement.on_host(t, cache)


class _Stager:
    """One optimizer's staging: where its state lives (learnt once per
    allocation) and the gradients it holds back during a step."""

    def __init__(self, opt):
        self.opt = opt
        self.raw_step = unhooked(type(opt).step)
        self.placement = {}  # (data_ptr, nbytes) -> lives on the host
        self.held_grads = None
        self.steps = 0  # steps staged, for tests and benchmarks
        self.unstaged_because = None  # why the last step was not staged
        self.rebinds = False  # the class's step rebound a state entry: never staged again
        self.pre_handle = None  # the staging's step pre-hook, kept last (order_last)

    def _plan(self, chunk_bytes):
        """Chunks: (group, [params], [(state, key, host tensor)], bytes),
        None when this step cannot be staged."""
        chunks, seen = [], set()
        for group in self.opt.param_groups:
            if group.get("fused") or group.get("differentiable"):
                # fused: one pass each way already, at the link's rate;
                # differentiable: the state's autograd history would pass
                # through the copies.
                return None
            cur = None
            for p in group["params"]:
                if p.grad is None or id(p) in seen:
                    continue  # (a parameter listed twice is updated once, as torch does)
                seen.add(id(p))
                if p.grad.is_sparse or not p.is_cuda:
                    return None
                state = self.opt.state.get(p)
                if not state:
                    return None  # a step that creates state runs as it is
                parts = [(state, k, t) for k, t in state.items()
                         if torch.is_tensor(t) and t.is_cuda and t.device == p.device and
                         t.numel() * t.element_size() >= _MIN_STAGED_BYTES and
                         _on_host(t, self.placement)]
                nbytes = sum(_padded(t) for _, _, t in parts)
                if cur is None or cur[3] + nbytes > chunk_bytes or cur[4] != p.device:
                    cur = [group, [], [], 0, p.device]
                    chunks.append(cur)
                cur[1].append(p)
                cur[2].extend(parts)
                cur[3] += nbytes
        if not any(c[3] for c in chunks):
            return None
        return chunks

    def run(self):
        """Updates every parameter with a gradient, staged; returns whether it
        did (if not, `unstaged_because` says why)."""
        if self.raw_step is None:
            self.unstaged_because = "the optimizer class's step has no unhooked form"
            return False
        if self.rebinds:
            self.unstaged_because = "the optimizer class's step rebinds state entries"
            return False
        chunks = self._plan(_settings["chunk_mib"] << 20)
        if chunks is None:
            self.unstaged_because = ("no state on the host, a step that creates state, or a "
                                     "fused step")
            return False
        if len({c[4] for c in chunks}) != 1:
            self.unstaged_because = "parameters on several devices"
            return False
        device = chunks[0][4]
        buf_bytes = max(c[3] for c in chunks)
        if 2 * buf_bytes > _placement.device_room(device):
            self.unstaged_because = "too little device memory for two chunks"
            return False
        self.unstaged_because = None
        self._pipeline(chunks, device, buf_bytes)
        # The class's step, which runs next, finds no gradient to apply.
        self.held_grads = []
        for c in chunks:
            for p in c[1]:
                self.held_grads.append((p, p.grad))
                p.grad = None
        self.steps += 1
        return True

    def _pipeline(self, chunks, device, buf_bytes):
        # One stream, two buffers: after chunk i's update, one copy kernel
        # stores chunk i to the host and loads chunk i+1 from it, so the
        # link carries both directions at once (the copy engines, queued
        # on two streams, took turns: half the rate each).
        bufs = [torch.empty(buf_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        views = [self._views(chunks[0], bufs[0])]
        _copy(list(zip(views[0], [h for _, _, h in chunks[0][2]])), [])
        saved_groups = self.opt.param_groups
        try:
            for i, (group, params, parts, _, _) in enumerate(chunks):
                mine = views[i]
                for (state, key, host), v in zip(parts, mine):
                    state[key] = v
                kept = [True] * len(parts)  # updated in place: its host copy gets the view
                try:
                    self.opt.param_groups = [dict(group, params=params)]
                    self.raw_step(self.opt)
                    for j, ((state, key, _), v) in enumerate(zip(parts, mine)):
                        if state.get(key) is not v:
                            kept[j] = False
                finally:
                    for (state, key, host), keep in zip(parts, kept):
                        if keep:
                            state[key] = host
                        else:
                            self._keep_rebound(state, key, bufs)
                    self.opt.param_groups = saved_groups
                stores = [(h, v) for (_, _, h), v, keep in zip(parts, mine, kept) if keep]
                loads = []
                if i + 1 < len(chunks):
                    views.append(self._views(chunks[i + 1], bufs[(i + 1) % 2]))
                    loads = list(zip(views[i + 1], [h for _, _, h in chunks[i + 1][2]]))
                _copy(loads, stores)
                views[i] = None
        finally:
            self.opt.param_groups = saved_groups

    def _keep_rebound(self, state, key, bufs):
        # The class's step put a new tensor in the entry instead of updating
        # the staged view: that tensor is the new state (the host copy is
        # stale), kept where it is unless it lives in a staging buffer.
        self.rebinds = True
        new = state.get(key)
        if torch.is_tensor(new) and new.is_cuda:
            try:
                ptr = new.untyped_storage().data_ptr()
            except Exception:  # noqa: BLE001 - a tensor with no storage of its own
                return
            if any(ptr == b.untyped_storage().data_ptr() for b in bufs):
                state[key] = new.clone()

    @staticmethod
    def _views(chunk, buf):
        out, off = [], 0
        for _, _, host in chunk[2]:
            n = host.numel() * host.element_size()
            out.append(buf[off:off + n].view(host.dtype).view(host.shape))
            off += _padded(host)
        return out

    def restore_grads(self):
        if self.held_grads is not None:
            for p, g in self.held_grads:
                p.grad = g
            self.held_grads = None


_PIECE_BYTES = 4 << 20


def _copy(loads, stores):
    """Each (dst, src) pair of `loads` (host to device) and `stores` (device
    to host): dst = src, bit for bit, by SM kernels. One _foreach_copy_ over
    4 MiB pieces, a load's and a store's alternating, so that the blocks
    running at any moment carry both directions (its blocks take the
    pieces in the list's order)."""
    def pieces(pairs):
        # As bytes: one dtype for the lot, which _foreach_copy_'s one-kernel
        # path needs (mixed dtypes fall back to a copy per piece).
        out = []
        for d, s in pairs:
            out += zip(d.view(-1).view(torch.uint8).split(_PIECE_BYTES),
                       s.view(-1).view(torch.uint8).split(_PIECE_BYTES))
        return out
    a, b = pieces(loads), pieces(stores)
    both = [p for pair in zip(a, b) for p in pair] + a[len(b):] + b[len(a):]
    if both:
        torch._foreach_copy_([d for d, _ in both], [s for _, s in both])


def _padded(t):
    # Each staged tensor starts 256-byte aligned in its buffer, as the
    # caching allocator aligns its blocks (vectorised kernels expect it).
    n = t.numel() * t.element_size()
    return (n + 255) // 256 * 256


def attach(opt):
    """Installs the staging on `opt` (once); a no-op for an optimizer whose
    class is not elementwise or whose step has no unhooked form."""
    if getattr(opt, "_cma_stager", None) is not None or type(opt) not in ELEMENTWISE:
        return
    stager = _Stager(opt)
    opt._cma_stager = stager

    def before(o, args, kwargs):
        # Gradients held by a step that raised after staging (so its
        # post-hook never ran) are not this step's to put back.
        stager.held_grads = None
        # args[0] is the optimizer; anything after it (a closure) or a
        # keyword the step takes leaves the step as it is.
        if _settings["enabled"] and len(args) <= 1 and not kwargs:
            stager.run()

    def after(o, args, kwargs):
        stager.restore_grads()

    stager.pre_handle = opt.register_step_pre_hook(before)
    handle = opt.register_step_post_hook(after)
    # First among the post-hooks, so that the caller's see the gradients.
    hooks = getattr(opt, "_optimizer_step_post_hooks", None)
    if hasattr(hooks, "move_to_end"):
        hooks.move_to_end(handle.id, last=False)


def order_last(opt):
    """Moves `opt`'s staging hook after every step pre-hook registered since
    (called by cma.torch's global step pre-hook, before the optimizer's own
    pre-hooks run, so that the staging sees what they did)."""
    s = getattr(opt, "_cma_stager", None)
    hooks = getattr(opt, "_optimizer_step_pre_hooks", None)
    if s is not None and s.pre_handle is not None and hasattr(hooks, "move_to_end") and \
            s.pre_handle.id in hooks:
        hooks.move_to_end(s.pre_handle.id)


def steps_staged(opt):
    """How many of `opt`'s steps were staged (0 when never attached)."""
    s = getattr(opt, "_cma_stager", None)
    return 0 if s is None else s.steps


def unstaged_because(opt):
    """Why `opt`'s last step was not staged: None if it was, or if the
    staging is off; "not attached" when cma never saw it oversubscribed."""
    s = getattr(opt, "_cma_stager", None)
    return "not attached" if s is None else s.unstaged_because
