"""Oversubscription's activation offload: room on the device for a training
step whose parameters, gradients and activations do not fit together.

With the optimizer's state on the host (torch._route_new_optimizer_state),
what still does not fit overflows by allocation order: whatever is asked
for once the device's part is full lives on the host, and in a training
step that is the logits and what the loss makes of them, read and written
over the link several times each. The activations that autograd saves for
backward early in the forward pass are the better ones to move: each is
written once and read once, at the end of backward. So, once a step has
overflowed, the next ones copy that many bytes (and a quarter more) of the
first saved activations to the host as forward saves them, on a side
stream, freeing their device memory as the copy ends, and bring them back
in backward ahead of use (up to 512 MiB in flight), again on the side
stream, which the consuming stream waits for. The copies are exact: losses
stay bit-identical. The amount only grows (by each step's overflow), up to
every saved activation.

How: autograd's saved-tensor hooks, installed for the process (the
calling thread's forward passes) when cma.torch first sees an optimizer
whose device is oversubscribed; a step ends at that optimizer's step.
Left alone: saved tensors under 1 MiB, parameters and views of them,
tensors on other devices, and anything saved while a CUDA graph is being
captured or torch.compile traces. CMA_ACTIVATION_OFFLOAD=0 (or
configure(False)) turns it off; =MiB moves that much from the first step
on. Not thread-safe: one training loop per
process, as the optimizer hook that drives it assumes.
"""
import os

import torch

from cma import _lib

_MIN_BYTES = 1 << 20
_PREFETCH_BYTES = 512 << 20
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
        self.seen = {}
        self.in_flight = 0  # bytes fetched back and not yet handed to backward
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
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        s = self.seen.get(key)
        if s is None:
            side = self._side()
            side.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(side):
                _lib.set_host_routing(True, self.index)
                try:
                    host = torch.empty_like(t)
                finally:
                    _lib.set_host_routing(False, self.index)
                host.copy_(t, non_blocking=True)
            t.record_stream(side)  # its memory is reused only after the copy
            s = self.seen[key] = _Saved(host, len(self.saved), n)
            self.saved.append(s)
            self.moved += n
            self.bytes_moved += n
        return s

    def _fetch(self, s):
        with torch.cuda.stream(self._side()):
            s.device = torch.empty_like(s.host)
            s.device.copy_(s.host, non_blocking=True)
            s.ready = torch.cuda.Event()
            s.ready.record()
        self.in_flight += s.nbytes

    def unpack(self, s):
        if not isinstance(s, _Saved):
            return s
        if s.device is None:
            self._fetch(s)
        cur = torch.cuda.current_stream(self.index)
        cur.wait_event(s.ready)
        d, s.device = s.device, None
        d.record_stream(cur)  # made on the side stream, used on this one
        self.in_flight -= s.nbytes
        # Backward wants them in the reverse of forward's order: fetch the
        # ones saved before this one while its gradient is computed.
        k = s.index - 1
        while k >= 0 and self.in_flight < _PREFETCH_BYTES:
            if self.saved[k].device is None and self.saved[k].host is not None:
                self._fetch(self.saved[k])
            k -= 1
        return d

    def end_step(self):
        """A step ended: learn from its overflow, forget its saved copies
        (backward is done with them; the host blocks go back to the cache)."""
        now = _overflow(self.index)
        overflow, self.mark = now - self.mark, now
        if _enabled and overflow > 0:
            self.target += overflow + overflow // 4
        self.steps += 1
        self.moved = self.in_flight = 0
        self.seen.clear()
        for s in self.saved:
            s.host = s.device = None
        self.saved = []


def _overflow(index):
    return _lib.stats(index).get("host_overflow_bytes", 0)


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
    global _installed
    for d in devices:
        o = _offloaders.setdefault(d, _Offloader(d))
        o.params.update(p.untyped_storage().data_ptr() for p in params if p.is_cuda)
    if not _installed:
        torch._C._autograd._push_saved_tensors_default_hooks(_pack, _unpack)
        _installed = True


def end_step(devices):
    for d in devices:
        if d in _offloaders:
            _offloaders[d].end_step()


def stats(device):
    """{"target", "bytes_moved", "steps"} of the device's offload, or None."""
    o = _offloaders.get(device)
    return None if o is None else {"target": o.target, "bytes_moved": o.bytes_moved,
                                   "steps": o.steps}
