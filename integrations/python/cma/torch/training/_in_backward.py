"""The state of one optimizer's step during backward (step_in_backward.py
installs it and states the contract): the post-accumulate-grad hook that
collects final gradients, the buckets applied on a side stream, the checks
at optimizer.step() and zero_grad(), and the move of the last bucket's
state to the device."""
import threading
import weakref

import torch

from cma import _lib
from cma.torch import _placement
from cma.torch.training import staged_step
from cma.torch.training._optim import unhooked

_PROBE_STEPS = 2  # plain steps first: a whole step-to-step cycle is seen before any update
_green = {}  # (device, sms) -> (green context, side stream), shared by optimizers
_graph_task = getattr(torch._C, "_current_graph_task_id", None)
_NAME = "cma.torch.step_in_backward"
_DROP = f"or drop the hint ({_NAME}(opt, False))"


def _freeze(v):
    """A comparable picture of a hyperparameter (a tensor by identity and version)."""
    if torch.is_tensor(v):
        return ("tensor", id(v), v._version)
    if isinstance(v, (tuple, list)):
        return tuple(_freeze(x) for x in v)
    return v


def _hyper(group):
    return tuple(sorted(((k, _freeze(v)) for k, v in group.items() if k != "params"),
                        key=lambda kv: kv[0]))


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:  # values that do not compare as one bool (arrays)
        return a is b


def _distributed():
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


def _shape(p):
    return tuple(p.shape)


class _InBackward:
    def __init__(self, opt, bucket_bytes, sms, free_grads):
        self._opt = weakref.ref(opt, self._on_opt_gone)
        self.bucket_bytes = bucket_bytes
        self.sms = sms
        self.free_grads = free_grads
        self.raw_step = unhooked(type(opt).step)
        self.lock = threading.RLock()
        self.hooked = set()  # ids of the parameters carrying the hook
        self.group_index = {}  # id(param) -> index of its group, looked up each iteration
        self.probe_left = _PROBE_STEPS  # plain steps still to check
        self.in_step = False  # inside optimizer.step() (a closure's backward applies nothing)
        self.reached = {}  # id -> param with a final gradient since the last step
        self.pending = {}  # device -> {id: param} not yet applied
        self.pending_bytes = {}  # device -> bytes of it
        self.full = set()  # devices whose pending filled a bucket (applied at the next hook)
        self.noted = {}  # id -> (param, hyperparameters, grad, grad version) as applied
        self.applied = set()  # ids applied in backward since the last step
        self.hidden = []  # (param, grad) set aside while optimizer.step() runs
        self.ready = {}  # (device, stream id) -> (stream, event after its last final gradient)
        self.events = {}  # device -> events free for reuse
        self.side = {}  # device index -> side stream
        self.side_sms = {}  # device index -> SMs of its green context, or None (all)
        self.end_task = None  # the graph task whose end callback is queued
        self.handles = []
        self.first_id = self.last_id = None  # this hint's first and last step pre-hooks
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

    @property
    def probing(self):
        return self.probe_left > 0

    def _when(self):
        return ("nothing was updated: the hint's first steps are checked before it applies "
                "anything" if self.probing else
                "the hint had already applied that backward's updates")

    # ------------------------------------------------------------ backward
    def on_grad(self, p):
        with self.lock:
            if self.opt() is None or p.grad is None or self.in_step:
                return
            if _distributed():
                raise RuntimeError(
                    f"{_NAME}: torch.distributed was initialised after the hint was attached "
                    "(init_process_group, DDP); each gradient would be applied before its "
                    "all-reduce and the ranks would diverge. Nothing of this backward was "
                    f"applied. Fix: use data parallelism without the hint, {_DROP}")
            if id(p) in self.reached:
                n = self.noted.get(id(p))
                p.grad = None  # refused: this backward's gradient is dropped
                if n is not None:
                    self.noted[id(p)] = (p, n[1], None, None, n[4])
                raise RuntimeError(
                    f"{_NAME}: a second backward reached a parameter {_shape(p)} before "
                    f"optimizer.step() ({self._when()}); gradients cannot accumulate over "
                    "backward passes, and a backward for another purpose (a GAN's generator "
                    "loss through the discriminator, saliency, an LR finder) would update the "
                    "parameters. Fix: call optimizer.step() after each backward (sum the "
                    "losses into one backward); compute other gradients with "
                    "torch.autograd.grad(loss, inputs) or with these parameters' "
                    f"requires_grad off for that backward; {_DROP}")
            if p.grad.is_sparse:
                return  # left for optimizer.step()
            self.reached[id(p)] = p
            task = _graph_task() if _graph_task is not None else 0
            if task != self.end_task:
                # Keyed by graph task: a backward that raised never ran its
                # callback, and must not keep the next one from queueing.
                self.end_task = task
                torch.autograd.Variable._execution_engine.queue_callback(self.on_backward_end)
            device = p.device.index
            if not self.probing:
                # After every earlier parameter's gradient and hooks.
                self._mark_ready(device, torch.cuda.current_stream(p.device))
            if device in self.full:
                self.apply_pending(device)  # not p: its later hooks have not run
            self.pending.setdefault(device, {})[id(p)] = p
            nbytes = self.pending_bytes.get(device, 0) + p.numel() * p.element_size()
            self.pending_bytes[device] = nbytes
            if nbytes >= self.bucket_bytes:
                self.full.add(device)

    def on_backward_end(self):
        # Runs on the caller's streams (autograd's post-processing, synced
        # with the streams that made gradients): the last bucket waits for
        # them (hooks after the hint included), and they wait for the
        # updates, so what the caller queues next reads updated parameters.
        with self.lock:
            self.end_task = None
            if not self.probing:
                for device in [d for d, ps in self.pending.items() if ps]:
                    self._mark_ready(device, torch.cuda.current_stream(device))
            self.apply_pending()
            self._join()

    def _mark_ready(self, device, stream):
        key = (device, stream.stream_id)
        entry = self.ready.get(key)
        if entry is None:
            free = self.events.setdefault(device, [])
            entry = self.ready[key] = (stream, free.pop() if free else torch.cuda.Event())
        entry[1].record(stream)

    def _join(self):
        """The current streams, and the streams that made gradients, wait for
        the side streams; the latter are then forgotten (not kept alive)."""
        for device, side in self.side.items():
            torch.cuda.current_stream(device).wait_stream(side)
            for (d, _), (stream, _) in self.ready.items():
                if d == device:
                    stream.wait_stream(side)
        for (d, _), (_, ev) in self.ready.items():
            self.events.setdefault(d, []).append(ev)
        self.ready = {}

    def apply_pending(self, device=None):
        with self.lock:
            opt = self.opt()
            done = []
            for d in ([device] if device is not None else list(self.pending)):
                ps = list(self.pending.pop(d, {}).values())
                self.pending_bytes.pop(d, None)
                self.full.discard(d)
                if opt is None:
                    continue
                if not self.noted:  # the iteration's first: groups as they are now
                    self.group_index = {id(q): i for i, g in enumerate(opt.param_groups)
                                        for q in g["params"]}
                # Not in any group now: optimizer.step() would not update it.
                ps = [p for p in ps if p.grad is not None and id(p) in self.group_index]
                if not ps:
                    continue
                hyper = {}
                for p in ps:
                    i = self.group_index[id(p)]
                    if i not in hyper:
                        hyper[i] = _hyper(opt.param_groups[i])
                if self.probing:  # what would be applied, checked at the step
                    for p in ps:
                        self.noted[id(p)] = (p, hyper[self.group_index[id(p)]], p.grad,
                                             p.grad._version, p._version)
                    continue
                side = self._side(d)
                for (dd, _), (_, ev) in self.ready.items():
                    if dd == d:
                        side.wait_event(ev)
                grads = [p.grad for p in ps]
                with torch.cuda.stream(side):
                    self._step(opt, ps)
                for p, g in zip(ps, grads):
                    g.record_stream(side)  # its memory returns after the update
                    keep = None if self.free_grads else g
                    p.grad = keep  # (the staging's path takes it)
                    self.applied.add(id(p))
                    # p's version after its update (bumped when the update is queued)
                    self.noted[id(p)] = (p, hyper[self.group_index[id(p)]], keep,
                                         None if keep is None else g._version, p._version)
                done += ps
                self.buckets += 1
            if done:
                self.last_bucket = done

    def _step(self, opt, params):
        """The class's own step over `params` alone, each in its own group's
        hyperparameters; new state routed as a whole step's would be."""
        groups = {}
        for p in params:
            groups.setdefault(self.group_index[id(p)], []).append(p)
        saved = opt.param_groups
        tiers = []
        try:
            if _placement.state_incomplete(opt, params):
                tiers = _placement.state_tiers(opt, params)
            for t in tiers:
                t.__enter__()
            opt.param_groups = [dict(saved[i], params=ps) for i, ps in groups.items()]
            stager = getattr(opt, "_cma_stager", None)
            if stager is not None and staged_step._settings["enabled"] and stager.run():
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

    # ------------------------------------------ optimizer.step(), zero_grad()
    def first_pre_hook(self):
        """First of the optimizer's pre-hooks: the streams catch up."""
        with self.lock:
            # A backward that raised never ended: its parameters not applied
            # keep their gradients for this step, as in a plain loop.
            self.end_task = None
            self.pending, self.pending_bytes, self.full = {}, {}, set()
            self._join()
            for p, g in self.hidden:  # a step that raised kept them
                if p.grad is None:
                    p.grad = g
            self.hidden = []
            self.in_step = True
            opt = self.opt()
            if not self.tail_placed and opt is not None and self.last_bucket:
                self.tail_placed = True
                self.tail_state_bytes = _tail_to_device(opt, self.last_bucket, self._side)

    def last_pre_hook(self):
        """After the caller's pre-hooks (before the staging's): the checks,
        then the step is kept from applying again what backward applied."""
        with self.lock:
            opt = self.opt()
            if opt is None:
                return
            self._check(opt, grads=True)
            for i in self.applied:
                p = self.noted[i][0]
                if p.grad is not None:
                    self.hidden.append((p, p.grad))
                    p.grad = None

    def post_hook(self):
        with self.lock:
            self._join()
            hidden, self.hidden = self.hidden, []
            for p, g in hidden:
                if p.grad is None:
                    p.grad = g
            opt = self.opt()
            try:
                if opt is not None and not self.probing:
                    # A pre-hook registered since the last step ran after the check.
                    self._check(opt, grads=False)
            finally:
                self.reached, self.noted, self.applied = {}, {}, set()
                self.in_step = False
                if self.probe_left:
                    self.probe_left -= 1
                if opt is not None:
                    self.order_hooks(opt)

    def _check(self, opt, grads):
        if not self.noted:
            return
        now = {}
        for g in opt.param_groups:
            h = None
            for p in g["params"]:
                if id(p) in self.noted:
                    h = _hyper(g) if h is None else h
                    now[id(p)] = h
        moved = [(n, now.get(i)) for i, n in self.noted.items() if not _same(now.get(i), n[1])]
        if moved:
            (p, before, _, _, _), after = moved[0]
            keys = sorted(k for k in dict(before) if after is None or
                          not _same(dict(before).get(k), dict(after).get(k, object())))
            if after is not None:
                keys += sorted(set(dict(after)) - set(dict(before)))
            what = ("left the param groups" if after is None else
                    "changed " + ", ".join(keys or ["group"]))
            raise RuntimeError(
                f"{_NAME}: the hyperparameters of {len(moved)} parameter(s) changed between "
                f"backward and optimizer.step() (parameter {_shape(p)}: {what}; a scheduler "
                "stepped before the optimizer, warmup or ReduceLROnPlateau writing lr before "
                "the step, a step pre-hook, param groups rebuilt), while the hint applies "
                f"them during backward with the values set then; {self._when()}. Fix: change "
                "hyperparameters after optimizer.step() (step schedulers after the "
                f"optimizer) or before the forward, {_DROP}")
        written = [n[0] for n in self.noted.values() if n[0]._version != n[4]]
        if written:
            raise RuntimeError(
                f"{_NAME}: {len(written)} parameter(s) (the first {_shape(written[0])}) were "
                "written in place between backward and optimizer.step() (a max-norm "
                "projection, weights loaded or reset before the step), while the hint updates "
                f"each during backward; {self._when()}. Fix: write parameters after "
                f"optimizer.step() or before the forward, {_DROP}")
        if not grads:
            return
        edited = [n[0] for n in self.noted.values()
                  if n[0].grad is not n[2] or (n[2] is not None and n[2]._version != n[3])]
        if edited:
            raise RuntimeError(
                f"{_NAME}: the gradients of {len(edited)} parameter(s) (the first "
                f"{_shape(edited[0])}) were edited or replaced between backward and "
                "optimizer.step() (loss unscaling, clipping, gradient noise, a filter), while "
                f"the hint applies each gradient during backward; {self._when()}. Fix: edit "
                "gradients inside backward with param.register_post_accumulate_grad_hook "
                f"(it runs before the hint applies them), {_DROP}")

    def before_zero_grad(self, set_to_none):
        with self.lock:
            if self.in_step or self.opt() is None:
                return
            if self.free_grads and not set_to_none:
                raise ValueError(
                    f"{_NAME}: zero_grad(set_to_none=False) with free_grads=True: a parameter "
                    "that a backward does not reach would not be updated, where a plain loop "
                    "applies its zero gradient (weight decay, momentum). Fix: zero_grad() "
                    "(set_to_none=True), or the hint with free_grads=False")
            if self.reached:
                raise RuntimeError(
                    f"{_NAME}: zero_grad() discards the gradients of {len(self.reached)} "
                    "parameter(s) that a backward made since the last optimizer.step() "
                    f"(a skipped step, or a backward for another purpose); {self._when()}. Fix: "
                    "compute gradients you do not step with by torch.autograd.grad(loss, "
                    "inputs) or with these parameters' requires_grad off for that backward (a "
                    "GAN's discriminator during the generator's loss); loops that skip steps "
                    f"(NaN/inf checks, errors in backward) cannot use the hint: {_DROP}")

    def order_hooks(self, opt):
        """This hint's first pre-hook first, its last after the caller's (and
        before the staging's, which must not see what backward applied)."""
        pre = getattr(opt, "_optimizer_step_pre_hooks", None)
        if not hasattr(pre, "move_to_end"):
            return
        if self.first_id in pre:
            pre.move_to_end(self.first_id, last=False)
        if self.last_id in pre:
            pre.move_to_end(self.last_id)
        for hid, fn in list(pre.items()):
            if getattr(fn, "__module__", None) == staged_step.__name__:
                pre.move_to_end(hid)


def _tail_to_device(opt, params, side_of):
    """After the first applying backward: the state of the bucket applied last (the
    parameters whose gradient is final last, such as a tied embedding) is
    updated after backward has ended, so over the link it adds its time to
    every step. It moves to the device where the device's part kept room
    for it at its populated peak, with 256 MiB to spare and, for a step the
    staging will serve from the next one on, its two chunk buffers; returns
    the bytes moved. An explicit host_resident() hint wins. The copies are
    made on the side stream that updates them (`side_of(device)`), so they
    belong to its pool as the host copies did."""
    if getattr(opt, "_cma_host_resident", False):
        return 0
    parts = []
    for p in params:
        for k, t in opt.state.get(p, {}).items():
            if torch.is_tensor(t) and t.is_cuda and t.numel() * t.element_size() >= \
                    staged_step._MIN_STAGED_BYTES and _placement.on_host(t):
                parts.append((p, k, t))
    need = sum(t.numel() * t.element_size() for _, _, t in parts)
    if not need:
        return 0
    spare = 256 << 20
    staged = staged_step._settings["enabled"] and \
        not all(g.get("fused") for g in opt.param_groups)
    if staged:
        spare += 2 * (staged_step._settings["chunk_mib"] << 20)
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
            if _placement.on_host(new):
                continue  # no room after all: the host copy stays
            new.copy_(t)
        t.record_stream(side)  # read there: freed in its order whatever made it
        opt.state[p][k] = new  # the host copy is freed in the side stream's order
        moved += t.numel() * t.element_size()
    for device in {t.device.index for _, _, t in parts}:
        torch.cuda.current_stream(device).wait_stream(side_of(device))
    return moved



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
            except (ImportError, AttributeError, RuntimeError, TypeError):
                # Not offered (older torch, ROCm, no driver support): all SMs,
                # and side_stream_sms() says None.
                hit = _green[(device, sms)] = (None, None)
        if hit[1] is not None:
            return hit[1], sms
    return torch.cuda.Stream(device=device), None


