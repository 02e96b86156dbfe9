"""Oversubscription's activation offload: room on the device for a training
step whose parameters, gradients and activations do not fit together.

With the optimizer's state on the host (plan.route_new_optimizer_state),
what still does not fit overflows by allocation order: whatever is asked
for once the device's part is full lives on the host. Where that is most
of the activations (3x oversubscription of a GPT-2 step: 23 GB a step,
three times the device's part), each is read and written over the link
several times. The activations autograd saves for backward are better
moved whole: each is written once in forward and read once in backward.
So, after a step whose overflow was at least a quarter of the device's
part, the next steps copy that many bytes (and a quarter more; the amount
grows by each later overflow) of the first saved activations to the host
as forward saves them, on a side stream (the forward stream waits for
each copy two saves later and frees the device copy in its own order, so
the memory serves the next allocations at once), and bring them back in
backward ahead of use (up to 512 MiB in flight), on the side stream, which
the consuming stream waits for. The copies are exact: losses stay
bit-identical. Measured (bench/results/h200_oversub_staged/): at 3x, 1.25-
1.35 s a step against 3.68-3.75 by allocation order alone; at 1.5x, where
only the logits overflow (10% of the device's part), moving 1.9 GB of
activations instead made steps slower (0.69-0.84 s against 0.60), hence
the threshold.

How: autograd's saved-tensor hooks, pushed by a global nn.Module forward
pre-hook when the outermost module call of the thread that steps the
optimizer starts, and popped when it returns or raises: so only forwards
of nn.Modules are offloaded, and outside them the default-hooks stack is
the caller's (torch.func transforms work, a user's saved_tensors_hooks
context is never shadowed). cma stays out of a forward that starts with
a user's hooks active (save_on_cpu, activation compression, checkpoint)
or with saved-tensor hooks disabled (torch.func). The module hooks are
registered once a step has set an amount to move (registered, they cost
even when nothing moves) and removed by configure(False). cma.torch
watches the devices of every optimizer whose device is oversubscribed,
and the amount moved is counted per step, which ends at that optimizer's
step. A saved activation belongs to its autograd graph, not to the step:
its host copy lives as long as the graph holds it (a GAN's generator
graph used after the discriminator's step, retain_graph), and is freed
with it.
Streams: the copy out reads the saved tensor on the side stream, which
is recorded on it (record_stream: a tensor allocated on another stream is
not reused before the copy is done); a copy brought back is recorded on
the stream that consumes it when that is another; one brought back ahead
and never consumed (a backward that raised or stopped early) is freed
after its allocating stream waited for its copy; a step's end makes the
current stream wait for the side stream.
Left alone: saved tensors under 1 MiB, parameters and views of them,
tensor subclasses, tensors on other devices, and anything saved while a
CUDA graph is being captured or torch.compile traces.
CMA_ACTIVATION_OFFLOAD=0 (or configure(False)) turns it off; =MiB moves
that much from the first step on, whatever the overflow (configure(mib=)
the same at run time). Not thread-safe: one training loop per process,
as the optimizer hook that drives it assumes.
"""
import os
import threading
import weakref

import torch

from cma import _lib
from cma.torch import _placement

_MIN_BYTES = 1 << 20
_PREFETCH_BYTES = 512 << 20
_MIN_OVERFLOW_SHARE = 0.25
_env = os.environ.get("CMA_ACTIVATION_OFFLOAD", "").strip()
_enabled = _env not in ("0", "off", "false")
# CMA_ACTIVATION_OFFLOAD=MiB: move that much from the first step on (the
# learnt amount still grows past it).
_initial_target = int(_env) << 20 if _env.isdigit() and int(_env) > 0 else 0
_offloaders = {}  # device index -> _Offloader
_module_hooks = None  # the global forward pre/post hooks' handles while registered
_owner = None  # the thread whose forwards are offloaded (the one that steps)
_active = []  # its module calls under way, outermost first
_pushed = False  # cma's saved-tensor hooks are on that thread's stack now
_forward = 0  # outermost forwards with the hooks pushed, so far


def configure(enabled=None, mib=None):
    """Turns the offload on or off for steps from now on; `mib` (>= 0): move
    at least that many MiB of each step's saved activations from now on,
    whatever the overflow (CMA_ACTIVATION_OFFLOAD=MiB at run time; 0 leaves
    it to the learnt amount). Returns whether it is on. Off, cma's hooks
    leave PyTorch (nothing of cma's stays on the saved-tensor hooks stack)."""
    global _enabled, _initial_target
    if mib is not None:
        if int(mib) < 0:
            raise ValueError(f"cma activation offload: mib must be >= 0, not {mib}")
        _initial_target = int(mib) << 20
        for o in _offloaders.values():
            o.target = max(o.target, _initial_target)
    if enabled is not None:
        _enabled = bool(enabled)
    if enabled is not None or mib is not None:
        if _enabled:
            _install_when_needed()
        else:
            _uninstall()
    return _enabled


class _Group:
    """The saved activations of one outermost forward, in save order (weak:
    each lives as long as its autograd graph holds it)."""
    __slots__ = ("items",)

    def __init__(self):
        self.items = []


class _Saved:
    """A saved activation that lives on the host until backward wants it."""
    __slots__ = ("host", "device", "ready", "stream", "group", "index", "nbytes", "consumed",
                 "source", "version", "__weakref__")

    def __init__(self, host, group, nbytes):
        self.host, self.device, self.ready, self.stream = host, None, None, None
        self.group, self.index, self.nbytes, self.consumed = group, len(group.items), nbytes, False
        self.source, self.version = None, None  # set by _pack: the saved tensor, weakly
        group.items.append(weakref.ref(self))

    def __del__(self):
        # Brought back and never consumed (a backward that raised or stopped
        # early): its memory is freed in its allocating stream's order, so
        # that stream waits for the copy into it first.
        try:
            if self.device is not None and self.ready is not None:
                self.stream.wait_event(self.ready)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


class _Offloader:
    def __init__(self, index):
        self.index = index
        self.target = _initial_target  # bytes to move per step, learnt from overflow
        self.moved = 0  # this step
        self.group = None  # the current forward's _Group
        self.group_forward = -1  # the _forward it belongs to
        self.in_flight = 0  # bytes fetched ahead and not yet handed to backward
        self.holding = []  # (device tensor, its copy out's event, its stream), oldest first
        self.params = set()  # storages of the optimizers' parameters
        self.stream = None
        self.mark = _overflow(index)
        self.steps = 0
        self.bytes_moved = 0  # in all, for tests and benchmarks

    def _side(self):
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.index)
        return self.stream

    def pack(self, t):
        if self.moved >= self.target or not _enabled or type(t) is not torch.Tensor:
            return t
        n = t.numel() * t.element_size()
        if (n < _MIN_BYTES or t.layout != torch.strided or
                t.untyped_storage().data_ptr() in self.params or
                (t.requires_grad and t.is_leaf) or
                torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling()):
            return t
        if self.group is None or self.group_forward != _forward:
            self.group, self.group_forward = _Group(), _forward
        # Each save is its own copy: an earlier save of the same address may
        # name another tensor by now (the first one's memory is freed below).
        cur, side = torch.cuda.current_stream(t.device), self._side()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            _lib.set_host_routing(True, self.index)
            try:
                host = torch.empty_like(t)
            except torch.OutOfMemoryError:
                self.moved = self.target  # the host's part is full: keep the rest this step
                return t
            finally:
                _lib.set_host_routing(False, self.index)
            host.copy_(t, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        # Read on the side stream: t may have been allocated on another
        # stream than this one, whose order would free it.
        t.record_stream(side)
        s = _Saved(host, self.group, n)
        self.moved += n
        self.bytes_moved += n
        # The saving stream waits for the copy out two saves later (the copy
        # overlaps the work between).
        self.holding.append((t, copied, cur))
        self._release(keep=2)
        return s

    def _release(self, keep=0):
        # The stream each was saved on waits for its copy out.
        while len(self.holding) > keep:
            _, copied, stream = self.holding.pop(0)
            stream.wait_event(copied)

    def _fetch(self, s, cur):
        # Allocated in `cur`'s order; the side stream writes it after what
        # `cur` has queued so far.
        s.device, s.stream = torch.empty_like(s.host), cur
        side = self._side()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            s.device.copy_(s.host, non_blocking=True)
            s.ready = torch.cuda.Event()
            s.ready.record()

    def unpack(self, s):
        cur = torch.cuda.current_stream(self.index)
        self._release()
        if s.device is None:  # not fetched ahead (or consumed before: retain_graph)
            if s.host is None:
                raise RuntimeError("cma activation offload: a saved activation's host copy is "
                                   "gone (unpacked after its graph was freed?)")
            self._fetch(s, cur)
        else:
            self.in_flight = max(0, self.in_flight - s.nbytes)
        cur.wait_event(s.ready)
        d, s.device = s.device, None
        if s.stream != cur:  # fetched ahead for another stream: freed in that one's order
            d.record_stream(cur)
        s.consumed = True
        # Backward wants them in the reverse of forward's order: fetch the
        # ones saved before this one while its gradient is computed (never
        # one already consumed, nor one whose graph is gone).
        items = s.group.items
        k = s.index - 1
        while k >= 0 and self.in_flight < _PREFETCH_BYTES:
            e = items[k]()
            if e is not None and not e.consumed and e.device is None and e.host is not None:
                self._fetch(e, cur)
                self.in_flight += e.nbytes
            k -= 1
        return d

    def end_step(self):
        """A step ended: learn from its overflow and start counting anew.
        Saved copies stay with their graphs (a graph may outlive the step)."""
        st = _lib.stats(self.index)
        now = st.get("host_overflow_bytes", 0)
        overflow, self.mark = now - self.mark, now
        # Only where the overflow is a large share of the device's part: at
        # 1.5x (an overflow of 10%, the logits) moving activations made steps
        # slower, at 3x (300%, most activations) 2.8x faster; see the module
        # docstring.
        large = overflow >= _MIN_OVERFLOW_SHARE * st.get("managed_budget_bytes", 0)
        if _enabled and overflow > 0 and (self.target > 0 or large):
            self.target += overflow + overflow // 4
        self.steps += 1
        self._release()
        if self.stream is not None:  # nothing of the side stream's is pending after the step
            torch.cuda.current_stream(self.index).wait_stream(self.stream)
        self.moved = self.in_flight = 0
        self.group = None


def _overflow(index):
    return _lib.stats(index).get("host_overflow_bytes", 0)  # (cumulative)


class _Kept:
    """A saved tensor the offload leaves where it is. Under saved-tensor
    hooks autograd skips its check that a saved tensor was not modified in
    place after it was saved, so every tensor these hooks see carries its
    version at save, checked at unpack (_check_version)."""
    __slots__ = ("tensor", "version")

    def __init__(self, tensor, version):
        self.tensor, self.version = tensor, version


def _version(t):
    try:
        return t._version
    except RuntimeError:  # inference tensors keep no version
        return None


def _check_version(t, saved):
    if saved is None or t is None:
        return
    now = _version(t)
    if now is not None and now != saved:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{t.type()} {list(t.shape)}] is at version {now}; expected "
            f"version {saved} instead (checked by cma's activation offload, whose saved-tensor "
            "hooks turn off autograd's own check). Hint: do not modify a tensor in place "
            "after the forward saved it, or clone it first.")


def _pack(t):
    o = _offloaders.get(t.device.index) if t.is_cuda else None
    out = t if o is None else o.pack(t)
    if out is t:
        return _Kept(t, _version(t))
    out.source, out.version = weakref.ref(t), _version(t)
    return out


def _unpack(s):
    if isinstance(s, _Kept):
        _check_version(s.tensor, s.version)
        return s.tensor
    if not isinstance(s, _Saved):
        return s
    # The source is gone only if nothing held it after the save; then nothing
    # could write it after the save through autograd's graph either.
    _check_version(s.source(), s.version)
    return _offloaders[s.host.device.index].unpack(s)


def _top_hooks():
    """The saved-tensor default hooks on top of this thread's stack, or None."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return None
    try:
        return top(True)
    except TypeError:  # an older signature
        return top()


def _may_push():
    # Only where the forward saves anything, something is to move, and the
    # stack is free: a user's hooks (save_on_cpu, compression, a checkpoint
    # region) or disabled hooks (torch.func) leave cma out of this forward.
    if not _enabled or not torch.is_grad_enabled():
        return False
    if not any(o.target > 0 for o in _offloaders.values()):
        return False
    if not torch._C._autograd._saved_tensors_hooks_is_enabled():
        return False
    return _top_hooks() is None


def _before_forward(module, args):
    global _pushed, _forward
    if torch.compiler.is_compiling() or threading.get_ident() != _owner:
        return None
    _active.append(module)
    if len(_active) == 1 and _may_push():
        torch._C._autograd._push_saved_tensors_default_hooks(_pack, _unpack)
        _pushed = True
        _forward += 1
    return None


def _after_forward(module, args, output):
    # Registered with always_call: also runs when the forward raised.
    if torch.compiler.is_compiling() or threading.get_ident() != _owner:
        return None
    if not _active or _active[-1] is not module:
        return None  # a call whose pre-hook never ran (an earlier pre-hook raised)
    _active.pop()
    if not _active:
        _pop()
    return None


def _pop():
    global _pushed
    if not _pushed:
        return
    _pushed = False
    top = _top_hooks()
    if top is not None and top[0] is _pack:
        torch._C._autograd._pop_saved_tensors_default_hooks()
    else:  # someone pushed inside the forward and never popped: leave the stack as it is
        import warnings
        warnings.warn("cma activation offload: the saved-tensor hooks stack changed under a "
                      "forward (hooks pushed and not popped); cma's hooks were left on it")


def watch(devices, params):
    """Offload for `devices` (oversubscribed), never `params`' storages."""
    for d in devices:
        o = _offloaders.setdefault(d, _Offloader(d))
        o.params.update(a for a in (_placement.storage_address(p) for p in params if p.is_cuda)
                        if a is not None)
    _install_when_needed()


def _install_when_needed():
    # Only once something is to move: registered, the module hooks alone
    # cost (every module call takes nn.Module's slow path).
    global _module_hooks, _owner
    if _module_hooks is None and _enabled and any(o.target > 0 for o in _offloaders.values()):
        from torch.nn.modules import module as nn_module
        _owner = threading.get_ident()
        _module_hooks = (nn_module.register_module_forward_pre_hook(_before_forward),
                         nn_module.register_module_forward_hook(_after_forward,
                                                                always_call=True))


def _uninstall():
    global _module_hooks
    if _module_hooks is not None:
        for h in _module_hooks:
            h.remove()
        _module_hooks = None
    _pop()
    _active.clear()


def end_step(devices):
    for d in devices:
        if d in _offloaders:
            _offloaders[d].end_step()
    _install_when_needed()


def stats(device):
    """{"target", "bytes_moved", "steps"} of the device's offload, or None."""
    o = _offloaders.get(device)
    return None if o is None else {"target": o.target, "bytes_moved": o.bytes_moved,
                                   "steps": o.steps}


def hooks_installed():
    """Whether cma's module hooks are registered (for tests)."""
    return _module_hooks is not None
