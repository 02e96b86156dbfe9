"""Issue 47: cma.torch.step_in_backward(opt) against the plain loop, pattern
by pattern. Run on the GPU machine:
    CMA_LIBRARY=.../libcma.so python3 sib_patterns_route.py [cma]
(`cma`: cma is PyTorch's CUDA allocator; default: PyTorch's own). Each case
trains a tiny fp32 model from one seed twice, plain and with the hint
(bucket_mib=1 over 1 MiB weights, so buckets apply inside backward), and
asks for one of:
  same   - the parameters (and anything the loop logged) equal the plain
           loop's bit for bit (torch.equal);
  raise  - an error naming the hint and `match` is raised, and every
           parameter is what the plain loop had before that iteration
           (nothing changed);
  loud   - the residual the docs state: a misuse that first shows after the
           hint's two checked steps raises (naming the fix) at that
           iteration, after that backward's updates.
Prints one PASS/FAIL line per case; exits 1 on any FAIL."""
import gc
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402
# Bound before any hint is attached: the guard installed on the module later
# never sees calls through this name (issue 47's pattern 3).
from torch.nn.utils.clip_grad import clip_grad_norm_ as early_clip  # noqa: E402

if sys.argv[1:] == ["cma"]:
    cmat.use_as_default()
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
warnings.filterwarnings("ignore")  # schedulers stepped before the optimizer warn

W = 512  # a W x W fp32 weight is 1 MiB: with bucket_mib=1 each fills a bucket
ITERS = 6  # two checked (plain) steps, then four that apply inside backward
DEV = "cuda"


def batches(n=ITERS, d_in=64, d_out=8, rows=16):
    g = torch.Generator(device=DEV).manual_seed(1)
    return [(torch.randn(rows, d_in, device=DEV, generator=g),
             torch.randn(rows, d_out, device=DEV, generator=g)) for _ in range(n)]


DATA = None


def mlp(d_in=64, d_out=8):
    return torch.nn.Sequential(torch.nn.Linear(d_in, W), torch.nn.Tanh(),
                               torch.nn.Linear(W, W), torch.nn.Tanh(),
                               torch.nn.Linear(W, W), torch.nn.Tanh(),
                               torch.nn.Linear(W, d_out)).to(DEV)


class Run:
    """One training run: model(s), optimizer(s), the hint on `opt` or not."""

    def __init__(self, hint, models, opts, hinted=None, free_grads=False):
        self.hint, self.models, self.opts, self.log = hint, models, opts, []
        self.opt = opts[0]
        self.hinted = self.opt if hinted is None else hinted
        if hint:
            kw = {"free_grads": True} if free_grads else {}
            cmat.step_in_backward(self.hinted, bucket_mib=1, **kw)

    @property
    def model(self):
        return self.models[0]

    def params(self):
        return [p.detach().clone() for m in self.models for p in m.parameters()]

    def close(self):
        if self.hint:
            cmat.step_in_backward(self.hinted, False)


def adamw_run(hint, free_grads=False, **opt_kw):
    torch.manual_seed(0)
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), **dict(dict(lr=1e-2, weight_decay=0.1), **opt_kw))
    return Run(hint, [m], [opt], free_grads=free_grads)


def train_step(r, i, zero=True, set_to_none=True, between=None, scale=1.0):
    x, y = DATA[i]
    if zero:
        r.opt.zero_grad(set_to_none=set_to_none)
    loss = torch.nn.functional.mse_loss(r.model(x), y) * scale
    loss.backward()
    if between is not None:
        if between(r, i) == "skip":
            return
    r.opt.step()


def first_diff(a, b):
    for k, (x, y) in enumerate(zip(a, b)):
        if not torch.equal(x, y):
            return f"parameter #{k} {tuple(x.shape)} differs (max |d| " \
                   f"{(x - y).abs().max().item():.3g})"
    return None if len(a) == len(b) else "parameter count differs"


RESULTS = []


def case(name, build, loop, expect, match=None, iters=ITERS, at=None, extra=None):
    """build(hint) -> Run; loop(run, i) one iteration. `at`: the iteration
    the error must come at (raise/loud). `extra(plain, hinted)` -> error or None."""
    plain = hinted = None
    try:
        plain = build(False)
        snaps = [plain.params()]
        for i in range(iters):
            loop(plain, i)
            snaps.append(plain.params())
        plain.close()
        destroy_process_group()
        hinted = build(True)
        for i in range(iters):
            try:
                loop(hinted, i)
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {e}"
                if expect == "same":
                    return report(name, False, f"iteration {i} raised {msg[:300]}")
                if "step_in_backward" not in msg or (match and match not in msg):
                    return report(name, False, f"iteration {i} raised, but not the hint's "
                                  f"error naming {match!r}: {msg[:300]}")
                if at is not None and i != at:
                    return report(name, False, f"raised at iteration {i}, expected {at}: "
                                  f"{msg[:200]}")
                if expect == "raise":
                    d = first_diff(hinted.params(), snaps[i])
                    if d:
                        return report(name, False, f"raised at iteration {i}, but something "
                                      f"had changed: {d}")
                    return report(name, True, f"raised at iteration {i}, nothing changed: "
                                  f"{msg[:160]}")
                return report(name, True, f"loud at iteration {i} (after that backward's "
                              f"updates, the documented residual): {msg[:160]}")
        if expect != "same":
            return report(name, False, "nothing raised: the hint "
                          f"{'gave the plain result' if not first_diff(hinted.params(), snaps[-1]) else 'silently diverged: ' + first_diff(hinted.params(), snaps[-1])}")
        d = first_diff(hinted.params(), snaps[-1])
        if d is None and extra is not None:
            d = extra(plain, hinted)
        if d is None and plain.log != hinted.log:
            d = f"logged values differ: plain {plain.log} hint {hinted.log}"
        return report(name, d is None, d or f"bit-identical to the plain loop over {iters} "
                      "iterations")
    except Exception as e:  # noqa: BLE001 - a case that cannot run fails, the rest go on
        return report(name, False, f"the case itself raised {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:300] if str(e) else ''}")
    finally:
        for r in (plain, hinted):
            if r is not None:
                try:
                    r.close()
                except Exception:  # noqa: BLE001
                    pass
        destroy_process_group()
        gc.collect()


def destroy_process_group():
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def report(name, ok, detail):
    RESULTS.append(ok)
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)


# ------------------------------------------------------------------ the cases
def base_cases():
    def check_buckets(plain, hinted):
        from cma.torch.training import step_in_backward as sib
        n = sib.buckets_applied(hinted.hinted)
        # Two 1 MiB weights: at least two buckets a backward after the 2 checked steps.
        return None if n >= 2 * (ITERS - 2) else f"only {n} buckets applied inside backward"
    case("plain_loop", adamw_run, train_step, "same", extra=check_buckets)
    case("plain_loop_free_grads", lambda h: adamw_run(h, free_grads=True), train_step, "same",
         extra=check_buckets)
    case("plain_loop_fused_sgd_momentum",
         lambda h: sgd_run(h, fused=True), train_step, "same", extra=check_buckets)

    def accumulate(r, i):
        r.opt.zero_grad()
        x, y = DATA[i]
        for xs, ys in zip(x.chunk(2), y.chunk(2)):
            torch.nn.functional.mse_loss(r.model(xs), ys).backward()
        r.opt.step()
    case("accumulation_refused_before_any_update", adamw_run, accumulate, "raise",
         match="second backward", at=0)

    def closure_step(r, i):
        x, y = DATA[i]

        def closure():
            r.opt.zero_grad()
            loss = torch.nn.functional.mse_loss(r.model(x), y)
            loss.backward()
            return loss
        r.opt.step(closure)
    case("step_with_closure", adamw_run, closure_step, "same")


def sgd_run(hint, **kw):
    torch.manual_seed(0)
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), **dict(dict(lr=1e-2, momentum=0.9,
                                                      weight_decay=1e-2), **kw))
    return Run(hint, [m], [opt])


def item1_hyperparameters():
    def with_sched(make):
        def build(hint):
            r = adamw_run(hint)
            r.sched = make(r.opt)
            return r
        return build

    def sched_before(r, i):
        train_step(r, i, between=lambda r, i: r.sched.step())
    case("1_scheduler_stepped_before_optimizer",
         with_sched(lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)),
         sched_before, "raise", match="hyperparameters", at=0)

    def warmup(r, i):
        def write(r, i):
            for g in r.opt.param_groups:
                g["lr"] = 1e-2 * (i + 1) / 10
        train_step(r, i, between=write)
    case("1_warmup_written_before_step", adamw_run, warmup, "raise",
         match="hyperparameters", at=0)

    def pre_hook_build(hint):
        r = adamw_run(hint)
        r.count = [0]

        def hook(o, a, k):
            r.count[0] += 1
            for g in o.param_groups:
                g["lr"] = 1e-2 * 0.5 ** r.count[0]
        r.opt.register_step_pre_hook(hook)  # after the hint
        return r
    # Its first step runs it after the check (hooks are ordered at each
    # step's end): caught at the second, still a checked one.
    case("1_step_pre_hook_sets_lr", pre_hook_build, train_step, "raise",
         match="hyperparameters", at=1)

    metrics = [3.0, 2.0, 1.0, 1.0, 1.0, 1.0]

    def plateau(r, i):
        train_step(r, i, between=lambda r, i: r.sched.step(metrics[i]))
    case("1_plateau_fires_late_between_backward_and_step",
         with_sched(lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.5,
                                                                         patience=0)),
         plateau, "loud", match="hyperparameters", at=3)

    def sched_after(r, i):
        train_step(r, i)
        r.sched.step()
    case("1_scheduler_after_optimizer_ok",
         with_sched(lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5)),
         sched_after, "same")


class Branchy(torch.nn.Module):
    """A trunk every backward reaches and a branch only even iterations reach."""

    def __init__(self):
        super().__init__()
        self.trunk = mlp()
        self.branch = torch.nn.Linear(64, 8).to(DEV)

    def forward(self, x, i):
        y = self.trunk(x)
        return y + self.branch(x) if i % 2 == 0 else y


def item2_zero_grad_false():
    def build(opt_cls, **kw):
        def b(hint, free_grads=False):
            torch.manual_seed(0)
            m = Branchy()
            return Run(hint, [m], [opt_cls(m.parameters(), **kw)], free_grads=free_grads)
        return b

    def loop(r, i):
        x, y = DATA[i]
        r.opt.zero_grad(set_to_none=False)
        torch.nn.functional.mse_loss(r.model(x, i), y).backward()
        r.opt.step()
    case("2_zero_grad_false_unreached_param_adamw",
         build(torch.optim.AdamW, lr=1e-2, weight_decay=0.1), loop, "same")
    case("2_zero_grad_false_unreached_param_sgd_momentum",
         build(torch.optim.SGD, lr=1e-2, momentum=0.9, weight_decay=1e-2), loop, "same")
    b = build(torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    case("2_free_grads_refuses_zero_grad_false", lambda h: b(h, free_grads=h), loop, "raise",
         match="set_to_none=False", at=0)


def item3_grad_post_processing():
    def unscale(r, i):
        def div(r, i):
            for p in r.model.parameters():
                if p.grad is not None:
                    p.grad.div_(1024.0)
        train_step(r, i, scale=1024.0, between=div)
    case("3_manual_loss_unscaling", adamw_run, unscale, "raise", match="gradients", at=0)

    def clip(r, i):
        train_step(r, i, between=lambda r, i: early_clip(r.model.parameters(), 0.05))
    case("3_clip_bound_before_attach", adamw_run, clip, "raise", match="gradients", at=0)

    def clip_module(r, i):
        train_step(r, i, between=lambda r, i: torch.nn.utils.clip_grad_norm_(
            r.model.parameters(), 0.05))
    case("3_clip_looked_up_at_call", adamw_run, clip_module, "raise", match="clip", at=0)

    def norm(r, i):
        def log(r, i):
            gs = [p.grad for p in r.model.parameters() if p.grad is not None]
            r.log.append((len(gs), torch.nn.utils.get_total_norm(gs).item()))
        train_step(r, i, between=log)
    case("3_get_total_norm_logged", adamw_run, norm, "same")

    def nan_skip(at):
        def loop(r, i):
            def check(r, i):
                if not all(torch.isfinite(p.grad).all() for p in r.model.parameters()
                           if p.grad is not None):
                    r.opt.zero_grad()
                    return "skip"
            train_step(r, i, scale=float("nan") if i == at else 1.0, between=check)
        return loop
    case("3_nan_skip_during_checked_steps", adamw_run, nan_skip(1), "raise",
         match="discards", at=1)
    case("3_nan_skip_late", adamw_run, nan_skip(3), "loud", match="discards", at=3)


def item4_hook_after_attach():
    def build(hint):
        r = adamw_run(hint)
        def halve(p):  # a post-accumulate-grad hook must return None
            p.grad.mul_(0.5)
        for p in r.model.parameters():  # after the hint: run after its hook
            p.register_post_accumulate_grad_hook(halve)
        return r
    case("4_post_accumulate_grad_hook_after_attach", build, train_step, "same")


def item5_distributed_after_attach():
    import torch.distributed as dist
    if not dist.is_available():
        return report("5_init_process_group_after_attach", False, "torch.distributed missing")
    store = tempfile.mktemp(prefix="cma_sib_pg_")

    def loop(r, i):
        if i == 3 and not dist.is_initialized():
            if os.path.exists(store):
                os.remove(store)
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0,
                                    world_size=1)
        train_step(r, i)
    case("5_init_process_group_after_attach", adamw_run, loop, "raise",
         match="torch.distributed", at=3)


def item6_groups():
    def build(hint):
        torch.manual_seed(0)
        m = mlp()
        ps = list(m.parameters())
        opt = torch.optim.AdamW([{"params": ps[:4], "lr": 1e-2, "weight_decay": 0.1},
                                 {"params": ps[4:], "lr": 3e-3, "weight_decay": 0.0}])
        return Run(hint, [m], [opt])

    def reorder(r, i):
        if i == 3:
            r.opt.param_groups.reverse()
        train_step(r, i)
    case("6_groups_reordered_after_attach", build, reorder, "same")

    def do_move(r):  # the last weight to the first group (its lr and decay)
        a, b = r.opt.param_groups
        w = r.model[6].weight
        b["params"] = [q for q in b["params"] if q is not w]
        a["params"].append(w)

    def move(r, i):
        if i == 3:
            do_move(r)
        train_step(r, i)
    case("6_parameter_moved_between_groups", build, move, "same")

    def rebuild(r, i):
        if i == 3:
            r.opt.param_groups[:] = [dict(g, lr=g["lr"] * 0.5) for g in r.opt.param_groups]
        train_step(r, i)
    case("6_groups_rebuilt_as_new_dicts", build, rebuild, "same")

    def move_between(at):
        def loop(r, i):
            def mv(r, i):
                if i == at:
                    do_move(r)
            train_step(r, i, between=mv)
        return loop
    case("6_parameter_moved_between_backward_and_step", build, move_between(0), "raise",
         match="hyperparameters", at=0)
    case("6_parameter_moved_between_backward_and_step_late", build, move_between(3), "loud",
         match="hyperparameters", at=3)


def gan_run(hint):
    torch.manual_seed(0)
    d, g = mlp(8, 1), mlp(16, 8)
    opt_d = torch.optim.AdamW(d.parameters(), lr=1e-2, weight_decay=0.1)
    opt_g = torch.optim.AdamW(g.parameters(), lr=1e-2)
    return Run(hint, [d, g], [opt_d, opt_g], hinted=opt_d)  # the hint on D's optimizer


class _Boom(torch.autograd.Function):
    """Identity forward; its backward raises (a backward that fails half-way)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("boom (a backward that raises half-way)")


def item7_other_backwards():
    def gan(freeze):
        def loop(r, i):
            (d, g), (opt_d, opt_g) = r.models, r.opts
            real, z = DATA[i][1], DATA[i][0][:, :16].contiguous()
            fake = g(z)
            opt_d.zero_grad()
            err_d = ((d(real) - 1) ** 2).mean() + (d(fake.detach()) ** 2).mean()
            err_d.backward()
            opt_d.step()
            opt_g.zero_grad()
            if freeze:
                d.requires_grad_(False)  # the fix: G's loss leaves D's gradients alone
            ((d(fake) - 1) ** 2).mean().backward()
            if freeze:
                d.requires_grad_(True)
            opt_g.step()
        return loop
    case("7_gan_generator_loss_reaches_discriminator", gan_run, gan(False), "raise",
         match="discards", at=1)
    case("7_gan_discriminator_frozen_for_generator", gan_run, gan(True), "same")

    def saliency(fixed):
        def loop(r, i):
            x = DATA[i][0].clone().requires_grad_(True)
            out = r.model(x).pow(2).sum()
            if fixed:
                sal = torch.autograd.grad(out, x)[0]  # the fix: no parameter gradient
            else:
                r.opt.zero_grad()
                out.backward()
                sal = x.grad
            r.log.append(sal.abs().sum().item())
            train_step(r, i)
        return loop
    case("7_saliency_backward_each_iteration", adamw_run, saliency(False), "raise",
         match="discards", at=0)
    case("7_saliency_by_autograd_grad", adamw_run, saliency(True), "same")

    def lr_finder(r, i):
        if i == 3:  # one probe backward mid-training, its gradients thrown away
            x, y = DATA[i]
            torch.nn.functional.mse_loss(r.model(x) * 10, y).backward()
        train_step(r, i)
    case("7_lr_finder_backward_late", adamw_run, lr_finder, "loud", match="discards", at=3)

    def raised(r, i):
        x, y = DATA[i]
        r.opt.zero_grad()
        h = r.model[:4](x)  # the second half's parameters are reached, then _Boom raises
        if i == 3:
            try:
                torch.nn.functional.mse_loss(r.model[4:](_Boom.apply(h)), y).backward()
            except RuntimeError as e:
                if "boom" not in str(e):
                    raise
            r.opt.step()  # a plain loop steps what the failed backward left
            return
        torch.nn.functional.mse_loss(r.model[4:](h), y).backward()
        r.opt.step()
    case("7_backward_raised_then_step", adamw_run, raised, "same")


def hazards():
    # H4: a backward that raised must not keep later backwards from ending
    # (their last bucket applied, the caller's stream waiting) before step.
    def build(hint):
        torch.manual_seed(0)
        trunk, head_a, head_b = mlp(64, W), mlp(W, 8), torch.nn.Linear(W, 8).to(DEV)
        ps = [p for m in (trunk, head_a, head_b) for p in m.parameters()]
        return Run(hint, [trunk, head_a, head_b], [torch.optim.AdamW(ps, lr=1e-2)])

    def loop(r, i):
        trunk, head_a, head_b = r.models
        x, y = DATA[i]
        r.opt.zero_grad()
        h = trunk(x)
        if i == 3:
            try:  # reaches head_a's parameters, then raises before the trunk
                torch.nn.functional.mse_loss(head_a(_Boom.apply(h)), y).backward()
            except RuntimeError as e:
                if "boom" not in str(e):
                    raise
            torch.nn.functional.mse_loss(head_b(h), y).backward()  # disjoint parameters
            if r.hint:  # every update of this iteration is made when backward ends
                r.after_backward = r.params()
        else:
            torch.nn.functional.mse_loss(head_a(h) + head_b(h), y).backward()
        r.opt.step()
        if not r.hint and i == 3:
            r.after_step = r.params()

    def extra(plain, hinted):
        d = first_diff(hinted.after_backward, plain.after_step)
        return None if d is None else "after the backward that followed a raised one, " \
            "before optimizer.step(), the updates were not all made: " + d
    case("H4_backward_after_a_raised_one_ends", build, loop, "same", extra=extra)

    # H7: streams the caller makes per step are not kept by the hint.
    def per_step_stream(r, i):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            train_step(r, i)
        torch.cuda.current_stream().wait_stream(s)
        st = getattr(r.opt, "_cma_in_backward", None)
        if st is not None:
            r.kept = max(getattr(r, "kept", 0), len(st.ready))

    def kept(plain, hinted):
        n = getattr(hinted, "kept", 0)
        return None if n <= 1 else f"the hint kept {n} (stream, event) pairs after backward"
    case("H7_streams_made_per_step_not_kept", adamw_run, per_step_stream, "same", extra=kept)


def main():
    global DATA
    DATA = batches()
    base_cases()
    item1_hyperparameters()
    item2_zero_grad_false()
    item3_grad_post_processing()
    item4_hook_after_attach()
    item5_distributed_after_attach()
    item6_groups()
    item7_other_backwards()
    hazards()
    bad = RESULTS.count(False)
    print(f"{len(RESULTS) - bad} passed, {bad} failed", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
