"""Oversubscription's training plan: the global torch.optim hooks
(route_new_optimizer_state, installed by use_as_default()) route a new
optimizer's state to the host and attach the staged step (staged_step.py)
and the activation offload (offload.py) to every optimizer whose device is
oversubscribed. The hints of hints.py adjust it per optimizer; what each
optimizer carries: _cma_stager (the staging), _cma_host_resident
(host_resident()), _cma_in_backward (step_in_backward.py). staged_step and
offload are imported at their first use, as they read their environment
variables when imported.

The state goes to the host only as far as the device cannot keep it
(keep_state_that_fits): the first step makes it on the host; the next
step measures what a whole step needs of the device (its peak of live
device pages, a window of the allocator's own that the user's
reset_peak_memory_stats leaves alone: the first step's forward ran
without gradients, which a loop that zeroes them after the forward keeps
through the next forward); when it ends, as much of the state as fits
beside that peak is copied back to the device. So a model that fits pays
for the mode one copy of its state, once, and one slightly larger reads
only the rest over the link.
CMA_OPTIMIZER_STATE=host keeps all of it on the host (the placement of
earlier versions; host_resident() does the same per optimizer)."""
import os
import warnings
import weakref

import torch

from cma import _lib
from cma.torch import _placement

_routing = False  # the global hooks are registered
# Device memory the kept state leaves free beyond the measured step's peak:
# later steps' layouts differ by a few edge pages, and what overflows then
# is an activation read over the link many times.
_STATE_MARGIN_BYTES = 256 << 20
_MARGIN_SHARE = 64  # and 1/64 of the device's part
_PAGE = 2 << 20


def _state_placement():
    v = os.environ.get("CMA_OPTIMIZER_STATE", "fit").strip().lower()
    if v not in ("fit", "host"):
        raise ValueError(f"cma.torch: CMA_OPTIMIZER_STATE={v!r}: use 'fit' (the default: on "
                         "the device as far as it fits) or 'host' (all of it on the host)")
    return v


def state_room(device, peak):
    """Bytes of optimizer state that device `device` can keep beside a step
    whose live device pages peaked at `peak` bytes (its budget's device part
    less the peak and a margin); 0 when none."""
    budget = _lib.stats(device).get("managed_budget_bytes", 0)
    return max(0, budget - peak - _STATE_MARGIN_BYTES - budget // _MARGIN_SHARE)


def _foreach_temporaries(opt):
    """{device: bytes}: a foreach update (not fused) makes temporaries of
    about one state tensor per parameter at once (its sqrt of exp_avg_sq,
    say) when it runs on the device; the step that measured may have run
    staged, in chunks, and never shown them."""
    out = {}
    for group in opt.param_groups:
        if group.get("fused") or group.get("foreach") is False or "foreach" not in group:
            continue
        for p in group["params"]:
            if p.is_cuda:
                out[p.device.index] = out.get(p.device.index, 0) + p.numel() * p.element_size()
    return out


def _state_entries(opt, devices):
    """[(state dict, key, tensor)] of `opt`'s CUDA state on `devices`, and
    the storages that may move: every entry on them is the same whole,
    contiguous tensor (an entry that views another's storage differently
    keeps it where it is, so that the two stay one)."""
    entries, views = [], {}
    for group in opt.param_groups:
        for p in group["params"]:
            for key, t in list((opt.state.get(p) or {}).items()):
                if not torch.is_tensor(t) or not t.is_cuda or t.device.index not in devices:
                    continue
                try:
                    storage = t.untyped_storage()
                    whole = (t.storage_offset() == 0 and t.is_contiguous() and
                             storage.nbytes() == t.numel() * t.element_size())
                    where = storage.data_ptr()
                except Exception:  # a tensor with no storage of its own (a subclass)
                    continue
                entries.append((opt.state[p], key, t))
                views.setdefault(where, set()).add(
                    (t.dtype, tuple(t.shape)) if whole else None)
    movable = {where for where, v in views.items() if None not in v and len(v) == 1}
    return entries, movable


def keep_state_that_fits(opt, peaks):
    """Copies `opt`'s host-resident state back to the device, parameter by
    parameter in the optimizer's order, while it fits within
    state_room(device, peaks[device]) less a foreach update's temporaries;
    the entries are rebound to the copies (exact, queued on the current
    stream; entries holding one tensor keep sharing its copy) and the host
    blocks freed after that stream's copy. Returns {device: bytes kept}."""
    temporaries = _foreach_temporaries(opt)
    room = {d: state_room(d, peak) - temporaries.get(d, 0) for d, peak in peaks.items()}
    kept = {d: 0 for d in peaks}
    entries, movable = _state_entries(opt, room)
    copies = {}  # storage address -> its copy on the device, or None (it stays)
    stream = torch.cuda.current_stream()
    with torch.no_grad():
        for state, key, t in entries:
            where = t.untyped_storage().data_ptr()
            if where in copies:  # another entry holds the same tensor
                if copies[where] is not None:
                    state[key] = copies[where]
                continue
            copies[where] = None
            if where not in movable or not _placement.on_host(t):
                continue
            n = t.numel() * t.element_size()
            cost = n + (_PAGE // 2 if n >= (1 << 20) else 0)  # its share of edge pages
            d = t.device.index
            if cost > room[d]:
                continue
            copy = torch.empty_like(t)
            if _placement.on_host(copy):  # the device was fuller than the peak said
                continue
            copy.copy_(t)
            t.record_stream(stream)  # freed after the copy, whatever stream made it
            state[key] = copies[where] = copy
            room[d] -= cost
            kept[d] += n
    return kept


# Device -> {optimizer: the most device bytes live at once since its window
# opened}. The allocator has one window per device (take_live_peak), which
# every take restarts; each optimizer's is folded from it, so that two
# optimizers stepping in turn (a GAN, Muon beside AdamW) each see a whole
# iteration.
_windows = {}


def _fold(device):
    peak = _lib.take_live_peak(device)
    for opt, seen in list(_windows.get(device, {}).items()):
        _windows[device][opt] = max(seen, peak)


def _open_window(opt, devices):
    for d in devices:
        _fold(d)
        _windows.setdefault(d, weakref.WeakKeyDictionary())[opt] = 0


def _close_window(opt, devices):
    peaks = {}
    for d in devices:
        _fold(d)
        peaks[d] = _windows[d].pop(opt, 0)
    return peaks


def _keep_and_count(opt, peaks):
    """keep_state_that_fits; what it kept counts in the windows still open
    (they would have seen it live had it been there). A failure is warned
    about: the update has run, and the step must end as any other."""
    try:
        kept = keep_state_that_fits(opt, peaks)
    except Exception as e:  # noqa: BLE001 (an allocation refused, say)
        warnings.warn(f"cma.torch: the optimizer's state stays on the host: {e}", stacklevel=3)
        return
    for d, n in kept.items():
        for other in list(_windows.get(d, {})):
            _windows[d][other] += n


def route_new_optimizer_state():
    """Oversubscription's default placement for training: every optimizer's
    state lives on the host as far as the device cannot keep it (updated
    by staged_step.py; keep_state_that_fits), and saved
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
    _state_placement()  # a bad CMA_OPTIMIZER_STATE fails here, not at a step
    if _routing:
        return
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    _routing = True
    known = weakref.WeakKeyDictionary()  # optimizer -> devices with a host part, or ()
    entered = []
    # Optimizer -> devices: a step that creates state, then the step that
    # measures how much of it the devices keep.
    creating = weakref.WeakKeyDictionary()
    measuring = weakref.WeakKeyDictionary()

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
            if _state_placement() == "fit":
                creating[opt] = devices
            for d in devices:
                t = _placement.HostTier(d)
                t.__enter__()
                entered.append(t)

    def after(opt, args, kwargs):
        while entered:
            entered.pop().__exit__(None, None, None)
        measured = measuring.get(opt)
        # (Nothing moves while a CUDA graph captures the step: later.)
        if measured and not torch.cuda.is_current_stream_capturing():
            del measuring[opt]
            peaks = _close_window(opt, measured)
            # (A host_resident() hint given since keeps its state on the host.)
            if getattr(opt, "_cma_host_resident", False) is False:
                _keep_and_count(opt, peaks)
        made = creating.pop(opt, None)
        if made:
            _open_window(opt, made)  # from the end of this step to the end of its next
            measuring[opt] = made
        # A step ends an iteration: the next follows the plan learnt from it.
        devices = known.get(opt, ())
        if devices:
            from cma.torch.training import offload
            offload.end_step(devices)
        for d in devices:
            _lib.mark_iteration(d)

    register_optimizer_step_pre_hook(before)
    register_optimizer_step_post_hook(after)
