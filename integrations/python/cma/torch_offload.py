"""Oversubscription's activation offload: room on the device for a training
step whose parameters, gradients and activations do not fit together.

With the optimizer's state on the host (torch._route_new_optimizer_state),
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

How: autograd's saved-tensor hooks, installed for the process (the
calling thread's forward passes) at the end of the first step that sets
an amount to move (installed, they cost even when nothing moves); cma.torch
watches the devices of every optimizer whose device is oversubscribed, and
a step ends at that optimizer's step.
Left alone: saved tensors under 1 MiB, parameters and views of them,
tensors on other devices, and anything saved while a CUDA graph is being
captured or torch.compile traces. CMA_ACTIVATION_OFFLOAD=0 (or
configure(False)) turns it off; =MiB moves that much from the first step
on, whatever the overflow. Not thread-safe: one training loop per
process, as the optimizer hook that drives it assumes.
"""
import os

import torch

from cma import _lib

_MIN_BYTES = 1 << 20
_PREFETCH_BYTES = 512 << 20
_MIN_OVERFLOW_SHARE = 0.25
_env = os.environ.get("CMA_ACTIVATION_OFFLOAD", "").strip()
_enabled = _env not in ("0", "off", "false")
# CMA_ACTIVATION_OFFLOAD=MiB: move that much from the first step on (the
# learnt amount still grows past it).
_initial_target = int(_env) << 20 if _env.isdigit() and int(_env) > 0 else 0
_offloaders = {}  # device index -> _Offloader
_installed = False


def configure(enabled=None):
    """Turns the offload on or off for steps from now on; returns whether it is on."""
    global _enabled
    if enabled is not None:
        _enabled = bool(enabled)
    return _enabled


class _Saved:
    """A saved activation that lives on the host until backward wants it."""
    __slots__ = ("host", "device", "ready", "index", "nbytes")

    def __init__(self, host, index, nbytes):
        self.host, self.device, self.ready, self.index, self.nbytes = host, None, None, index, nbytes


class _Offloader:
    def __init__(self, index):
        self.index = index
        self.target = _initial_target  # bytes to move per step, learnt from overflow
        self.moved = 0  # this step
        self.saved = []  # this step's _Saved, in forward order
        self.in_flight = 0  # bytes fetched back and not yet handed to backward
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
        if self.moved >= self.target or not _enabled:
            return t
        n = t.numel() * t.element_size()
        if (n < _MIN_BYTES or t.untyped_storage().data_ptr() in self.params or
                (t.requires_grad and t.is_leaf) or
                torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling()):
            return t
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
        s = _Saved(host, len(self.saved), n)
        self.saved.append(s)
        self.moved += n
        self.bytes_moved += n
        # The device copy goes once this stream has waited for its copy
        # out, two saves later (the copy overlaps the work between):
        # freed in this stream's order, it serves the next allocations
        # at once, which an event-guarded free would not (the host runs
        # ahead of the GPU and would find it still busy).
        self.holding.append((t, copied, cur))
        self._release(keep=2)
        return s

    def _release(self, keep=0):
        # The stream each was saved on (whose order frees it) waits for
        # its copy out.
        while len(self.holding) > keep:
            _, copied, stream = self.holding.pop(0)
            stream.wait_event(copied)

    def _fetch(self, s, cur):
        # Allocated in the consuming stream's order; the side stream writes
        # it after what that stream has queued so far.
        s.device = torch.empty_like(s.host)
        side = self._side()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            s.device.copy_(s.host, non_blocking=True)
            s.ready = torch.cuda.Event()
            s.ready.record()
        self.in_flight += s.nbytes

    def unpack(self, s):
        if not isinstance(s, _Saved):
            return s
        cur = torch.cuda.current_stream(self.index)
        self._release()
        if s.device is None:
            self._fetch(s, cur)
        cur.wait_event(s.ready)
        d, s.device = s.device, None
        self.in_flight -= s.nbytes
        # Backward wants them in the reverse of forward's order: fetch the
        # ones saved before this one while its gradient is computed.
        k = s.index - 1
        while k >= 0 and self.in_flight < _PREFETCH_BYTES:
            if self.saved[k].device is None and self.saved[k].host is not None:
                self._fetch(self.saved[k], cur)
            k -= 1
        return d

    def end_step(self):
        """A step ended: learn from its overflow, forget its saved copies
        (backward is done with them; the host blocks go back to the cache)."""
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
        self.moved = self.in_flight = 0
        for s in self.saved:
            s.host = s.device = None
        self.saved = []


def _overflow(index):
    return _lib.stats(index).get("host_overflow_bytes", 0)  # (cumulative)


def _pack(t):
    o = _offloaders.get(t.device.index) if t.is_cuda else None
    return t if o is None else o.pack(t)


def _unpack(s):
    if not isinstance(s, _Saved):
        return s
    for o in _offloaders.values():
        if s.index < len(o.saved) and o.saved[s.index] is s:
            return o.unpack(s)
    raise RuntimeError("cma activation offload: a saved activation was unpacked after its "
                       "step ended (backward after optimizer.step()?)")


def watch(devices, params):
    """Offload for `devices` (oversubscribed), never `params`' storages."""
    for d in devices:
        o = _offloaders.setdefault(d, _Offloader(d))
        o.params.update(p.untyped_storage().data_ptr() for p in params if p.is_cuda)
    _install_when_needed()


def _install_when_needed():
    # Only once something is to move: installed, the hooks alone cost (a
    # 1.5x step with hooks that moved nothing: 0.68 s against 0.59).
    global _installed
    if not _installed and any(o.target > 0 for o in _offloaders.values()):
        torch._C._autograd._push_saved_tensors_default_hooks(_pack, _unpack)
        _installed = True


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
