"""Training patterns around oversubscription's staged step and activation
offload, and the CPU switch's aliases (issue 47), each against the plain
loop (same seed, same data, cma's features off) bit for bit, or checking
that misuse raises before anything changed. One PASS/FAIL line per case;
exits 1 on any failure.

    CMA_LIBRARY=.../libcma.so PYTHONPATH=integrations/python \\
        python3 offload_patterns_route.py

`oversubscribe:1` with CMA_OPTIMIZER_STATE=host lets the optimizer's state
live on the host (the staged step's precondition) without oversubscribing
anything; the offload is
forced by CMA_ACTIVATION_OFFLOAD=MiB (set here before cma.torch loads:
everything saved of 1 MiB or more moves; cma.torch.activation_offload(True,
mib=) is the same at run time) and switched per run with
activation_offload(True/False); each offload run checks that bytes moved.
Only public knobs are used, so the script also runs against older code."""
import gc
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
EVERYTHING_MIB = 1 << 20  # offload target: every saved tensor of 1 MiB or more
os.environ["CMA_ACTIVATION_OFFLOAD"] = str(EVERYTHING_MIB)
os.environ["CMA_OPTIMIZER_STATE"] = "host"
import torch  # noqa: E402
from torch import nn  # noqa: E402

import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402
from cma.torch.training import offload as torch_offload  # noqa: E402
from cma.torch.training import staged_step as torch_staged_step  # noqa: E402

cmat.use_as_default("oversubscribe:1")
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
W = 1024  # a (512, W) float activation is 2 MiB: above the offload's 1 MiB floor
ROWS = 512
failures = []


def case(name):
    def wrap(fn):
        t0 = time.time()
        try:
            r = fn()
            ok, why = r is True, "" if r is True else f": {r!r}"
        except Exception as e:  # noqa: BLE001 - reported as a failure
            ok, why = False, f": raised {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        torch.cuda.synchronize()
        cmat.activation_offload(False)
        cmat.staged_step(enabled=True)
        gc.collect()
        print(f"{'PASS' if ok else 'FAIL'} {name} ({time.time() - t0:.1f} s){why}", flush=True)
        if not ok:
            failures.append(name)
        return fn
    return wrap


def mlp(seed, depth=2, out=W):
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(W, 2 * W), nn.GELU(), nn.Linear(2 * W, W)]
    return nn.Sequential(*layers, nn.Linear(W, out)).cuda()


def batches(n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(ROWS, W, device="cuda", generator=g) for _ in range(n)]


def same(xs, ys):
    xs, ys = list(xs), list(ys)
    return len(xs) == len(ys) and all(torch.equal(a, b) for a, b in zip(xs, ys))


def state_of(opt, model):
    return [t for p in model.parameters() for _, t in sorted(opt.state[p].items())
            if torch.is_tensor(t)]


def moved():
    st = torch_offload.stats(torch.cuda.current_device())
    return 0 if st is None else st["bytes_moved"]


def with_cma(offload, staged=True):
    """cma's features for the next run: the offload forced on (or off), the
    staged step on (or off: the plain loop reads the state in place)."""
    cmat.staged_step(enabled=staged)
    cmat.activation_offload(bool(offload))


def top_hooks():
    """The saved-tensor default hooks on top of this thread's stack, or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(True)


def step(model, opt, x):
    loss = model(x).square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


# ---- item 8: the staged step ------------------------------------------------

@case("staged_prehook_registered_after_first_step")
def _():
    def run(staged):
        with_cma(False, staged)
        model = mlp(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        saw = []
        for i, x in enumerate(batches(6, 1)):
            if i == 2:  # a warmup/clip hook attached lazily, after the staging was
                def hook(o, args, kwargs):
                    saw.append(all(p.grad is not None for p in model.parameters()))
                    for g in o.param_groups:
                        g["lr"] = 5e-4
                    for p in model.parameters():
                        if p.grad is not None:
                            p.grad.mul_(0.5)
                opt.register_step_pre_hook(hook)
            step(model, opt, x)
        torch.cuda.synchronize()
        return model, opt, saw
    ref, ref_opt, _ = run(False)
    model, opt, saw = run(True)
    staged = torch_staged_step.steps_staged(opt)
    if staged < 3:
        return f"only {staged} steps staged ({torch_staged_step.unstaged_because(opt)})"
    if not all(saw):
        return f"the later pre-hook saw no gradients: {saw}"
    return same(model.parameters(), ref.parameters()) and \
        same(state_of(opt, model), state_of(ref_opt, ref)) or "parameters/state differ"


@case("staged_state_entry_rebound_by_step")
def _():
    def run(staged):
        with_cma(False, staged)
        model = mlp(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for i, x in enumerate(batches(5, 1)):
            if i == 2 and staged:
                # An optimizer step that rebinds its state entries (builds the
                # new moments in new tensors) instead of updating them in place.
                st = opt._cma_stager
                raw = st.raw_step

                def rebinding(o, raw=raw):
                    for g in o.param_groups:
                        for p in g["params"]:
                            s = o.state.get(p, {})
                            for k in ("exp_avg", "exp_avg_sq"):
                                if k in s:
                                    s[k] = s[k].clone()
                    return raw(o)
                st.raw_step = rebinding
            step(model, opt, x)
        torch.cuda.synchronize()
        return model, opt
    ref, ref_opt = run(False)
    model, opt = run(True)
    if not (same(model.parameters(), ref.parameters()) and
            same(state_of(opt, model), state_of(ref_opt, ref))):
        return "parameters/state differ"
    return torch_staged_step.steps_staged(opt) >= 1 or "nothing was staged"


# ---- item 9: the activation offload ---------------------------------------

def plain_vs_offload(loop, need_moved=True):
    with_cma(False, staged=False)
    ref = loop()
    torch.cuda.synchronize()
    with_cma(True)
    m0 = moved()
    got = loop()
    torch.cuda.synchronize()
    n = moved() - m0
    if need_moved and n == 0:
        return None, None, "the offload moved nothing"
    return ref, got, n


@case("offload_matches_plain_loop")
def _():
    def loop():
        model = mlp(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for x in batches(5, 1):
            step(model, opt, x)
        return list(model.parameters())
    ref, got, n = plain_vs_offload(loop)
    return n if ref is None else (same(got, ref) or "parameters differ")


@case("offload_retain_graph_and_partial_backward")
def _():
    def loop():
        model = mlp(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mid = []
        model[3].register_forward_hook(lambda m, a, out: mid.append(out))
        xs = batches(8, 1)
        for x, x2 in zip(xs[::2], xs[1::2]):
            mid.clear()
            loss = model(x).square().mean()
            opt.zero_grad()
            # A backward that stops halfway (the copies fetched ahead for the
            # layers below it wait), then two full ones over the same graph.
            torch.autograd.grad(loss, mid[0], retain_graph=True)
            loss.backward(retain_graph=True)
            loss.backward()
            opt.step()
            # A graph given only a partial backward and dropped: what was
            # fetched ahead for it is never consumed.
            mid.clear()
            torch.autograd.grad(model(x2).square().mean(), mid[0])
            mid.clear()
        return list(model.parameters())
    ref, got, n = plain_vs_offload(loop)
    return n if ref is None else (same(got, ref) or "parameters differ")


@case("offload_under_user_saved_tensors_hooks")
def _():
    def loop():
        calls = [0, 0]

        def pack(t):
            calls[0] += 1
            return t

        def unpack(t):
            calls[1] += 1
            return t
        model = mlp(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):  # spans the loop
            for x in batches(5, 1):
                step(model, opt, x)
        return list(model.parameters()), calls, top_hooks()
    ref, got, n = plain_vs_offload(loop, need_moved=False)
    if got[2] is not None:
        return "the saved-tensor hooks stack is not empty after the user's context"
    if got[1] != ref[1]:
        return f"the user's hooks ran {got[1]} times, {ref[1]} in the plain loop"
    if n != 0:
        return f"cma moved {n} bytes under the user's hooks"
    return same(got[0], ref[0]) or "parameters differ"


@case("offload_under_save_on_cpu")
def _():
    def loop():
        model = mlp(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with torch.autograd.graph.save_on_cpu():
            for x in batches(4, 1):
                step(model, opt, x)
        return list(model.parameters()), top_hooks()
    ref, got, _ = plain_vs_offload(loop, need_moved=False)
    if got[1] is not None:
        return "the saved-tensor hooks stack is not empty after save_on_cpu"
    return same(got[0], ref[0]) or "parameters differ"


@case("offload_then_torch_func")
def _():
    with_cma(True)
    model = mlp(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    m0 = moved()
    xs = batches(3, 1)
    for x in xs:
        step(model, opt, x)
    if moved() == m0:
        return "the offload moved nothing"
    w = torch.randn(W, device="cuda")

    def f(v):
        return (v.sin() * v).sum()
    g_on = torch.func.grad(f)(w)  # between steps, the offload on
    params = {k: v.detach() for k, v in model.named_parameters()}
    per_model = torch.func.grad(
        lambda p, x: torch.func.functional_call(model, p, (x,)).square().mean())(params, xs[0])
    cmat.activation_offload(False)
    if top_hooks() is not None:
        return "hooks left installed after activation_offload(False)"
    g_off = torch.func.grad(f)(w)
    wr = w.clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(f(wr), wr)
    model.zero_grad()
    model(xs[0]).square().mean().backward()
    ok_model = all(torch.allclose(per_model[k], p.grad, rtol=1e-4, atol=1e-6)
                   for k, p in model.named_parameters())
    return (torch.equal(g_on, g_off) and torch.allclose(g_on, g_ref) and ok_model) or \
        "torch.func results differ"


@case("offload_gan_two_optimizers")
def _():
    def loop():
        G, D = mlp(0), mlp(1, out=1)
        opt_g = torch.optim.AdamW(G.parameters(), lr=1e-3)
        opt_d = torch.optim.AdamW(D.parameters(), lr=1e-3)
        for x, z in zip(batches(4, 2), batches(4, 3)):
            fake = G(z)
            err_d = D(x).mean() - D(fake.detach()).mean()
            opt_d.zero_grad()
            err_d.backward()
            opt_d.step()  # ends a step while G's graph (saved before it) waits
            err_g = -D(fake).mean()
            opt_g.zero_grad()
            err_g.backward()
            opt_g.step()
        return list(G.parameters()) + list(D.parameters())
    ref, got, n = plain_vs_offload(loop)
    return n if ref is None else (same(got, ref) or "parameters differ")


# ---- randomized: streams, unpack orders, exceptions; with the hint ---------

class Boom(Exception):
    pass


def boom(grad):
    raise Boom()


class Branchy(nn.Module):
    """Two branches that may run on other streams, in either order; a
    tensor with two consumers and a node with two used outputs."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(W, W)
        self.b = nn.ModuleList(nn.Sequential(nn.Linear(W, 2 * W), nn.GELU(),
                                             nn.Linear(2 * W, W)) for _ in range(2))
        self.out = nn.Linear(W, W)

    def forward(self, x, plan):
        cur = torch.cuda.current_stream()
        h = self.inp(x)
        if plan["raise"] == "mid":
            h.register_hook(boom)
        outs = [None, None]
        for i in plan["order"]:
            s = plan["streams"][i]
            if s is None:
                outs[i] = self.b[i](h)
                continue
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                outs[i] = self.b[i](h)
            h.record_stream(s)
            cur.wait_stream(s)
            outs[i].record_stream(cur)
        a, b = (outs[0] * outs[1]).chunk(2, dim=1)
        y = self.out(torch.cat([a + b, b], dim=1))
        if plan["raise"] == "out":
            y.register_hook(boom)
        return y


SIDE = None


def random_loop(seed, hint, raises=(None, None, "out", "mid"), steps=10):
    global SIDE
    if SIDE is None:
        SIDE = [torch.cuda.Stream(), torch.cuda.Stream()]
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = Branchy().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if hint:
        cmat.step_in_backward(opt, bucket_mib=8)
    raised = 0
    for x in batches(steps, seed + 1):
        plan = {"order": rng.sample([0, 1], 2),
                "streams": [rng.choice([None] + SIDE) for _ in range(2)],
                "raise": rng.choice(raises)}
        opt.zero_grad(set_to_none=True)
        try:
            model(x, plan).float().square().mean().backward()
        except Boom:
            raised += 1
            opt.zero_grad(set_to_none=True)  # skip the batch
            continue
        opt.step()
    torch.cuda.synchronize()
    if hint:
        cmat.step_in_backward(opt, enabled=False)
    return list(model.parameters()), raised


@case("offload_random_streams_orders_exceptions")
def _():
    for seed in (11, 12, 13):
        ref, got, n = plain_vs_offload(lambda: random_loop(seed, hint=False))
        if ref is None:
            return n
        if got[1] != ref[1] or not same(got[0], ref[0]):
            return f"seed {seed}: parameters differ (raised {got[1]}/{ref[1]})"
    return True


@case("offload_random_streams_step_in_backward")
def _():
    # The hint applies buckets as gradients become final: a backward raises
    # here only before any parameter has one (at the model's output).
    raises = (None, None, "out")
    for seed in (21, 22):
        with_cma(False, staged=False)
        ref = random_loop(seed, hint=False, raises=raises)
        with_cma(True)
        m0 = moved()
        got = random_loop(seed, hint=True, raises=raises)
        if moved() == m0:
            return "the offload moved nothing"
        if got[1] != ref[1] or not same(got[0], ref[0]):
            return f"seed {seed}: parameters differ (raised {got[1]}/{ref[1]})"
    return True


# ---- item 10 and H8: the CPU switch's aliases, forked children ------------

@case("cpu_switch_refilled_staging_raises")
def _():
    cmat.managed_cpu()
    try:
        g = torch.Generator().manual_seed(5)
        first, second = torch.randn(ROWS, W, generator=g), torch.randn(ROWS, W, generator=g)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(W, W), nn.GELU(), nn.Linear(W, W)).cuda()
        torch.manual_seed(0)
        ref = nn.Sequential(nn.Linear(W, W), nn.GELU(), nn.Linear(W, W)).cuda()
        staging = torch.empty(ROWS, W)  # a loader's reused CPU buffer
        staging.copy_(first)
        xg = staging.to("cuda")
        if xg.data_ptr() != staging.data_ptr():
            return "staging.to('cuda') was not an alias"
        before = [p.detach().clone() for p in model.parameters()]
        loss = model(xg).square().mean()
        torch.cuda.synchronize()
        staging.copy_(second)  # refilled before backward: the saved input changed
        try:
            loss.backward()
            return "backward ran on the overwritten input (no error)"
        except RuntimeError as e:
            if "modified by an inplace operation" not in str(e):
                return f"another error: {e}"
        if not same(before, model.parameters()):
            return "parameters changed"
        # Refilled after backward: the plain loop's gradients.
        model.zero_grad()
        staging.copy_(first)
        xg = staging.to("cuda")
        model(xg).square().mean().backward()
        torch.cuda.synchronize()
        staging.copy_(second)
        ref(first.to("cuda", copy=True)).square().mean().backward()
        return same([p.grad for p in model.parameters()], [p.grad for p in ref.parameters()]) \
            or "gradients differ from the plain loop's"
    finally:
        cmat.managed_cpu(False)


@case("forked_child_calls_no_libcma")
def _():
    cmat.managed_cpu()
    try:
        e = cmat.empty_managed(1 << 20)
        pid = os.fork()
        if pid == 0:  # the child: must not reach libcma (its CUDA runtime is unusable)
            code = 1
            try:
                calls = []
                for name in ("free", "allocation_size", "move", "malloc"):
                    setattr(cma._lib, name, lambda *a, _n=name, **k: calls.append(_n))
                del e  # (no gc.collect: a collected CUDA tensor would free through cma in C++)
                try:
                    torch.ones(4).to("cuda")  # the switch's Tensor.to in a worker
                except Exception:  # noqa: BLE001 - PyTorch's bad-fork error
                    pass
                code = 0 if not calls else 3
            finally:
                os._exit(code)
        deadline = time.time() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.time() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                return "the child hung"
            time.sleep(0.05)
        del e
        rc = os.waitstatus_to_exitcode(status)
        return rc == 0 or f"child exit {rc} (3: it called libcma)"
    finally:
        cmat.managed_cpu(False)


print(f"{'FAIL' if failures else 'PASS'} all ({len(failures)} failed: {failures})", flush=True)
sys.exit(1 if failures else 0)
