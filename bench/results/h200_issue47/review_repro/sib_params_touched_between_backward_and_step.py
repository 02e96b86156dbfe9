"""step_in_backward: code between backward() and optimizer.step() that reads or
writes PARAMETERS (not gradients or hyperparameters, which the hint checks):
  snapshot  - weights snapshotted before the step for an update/weight ratio
              diagnostic (or an EMA/SWA update placed before the step);
  max_norm  - a max-norm weight projection applied before the step.
Plain loop: the step sees/follows them. The hint: silently different, and not
even caught late (the checks compare gradients and hyperparameters only;
p._version would catch the write)."""
import _common  # noqa: F401
import torch
import cma.torch as cmat
from _common import deterministic, finish

deterministic(torch)
N = 512


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, N), torch.nn.Tanh(), torch.nn.Linear(N, N),
                               torch.nn.Tanh(), torch.nn.Linear(N, 8)).cuda()


def run(kind, hint, steps=6):
    torch.manual_seed(0)
    m = mlp()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    if hint:
        cmat.step_in_backward(opt, bucket_mib=1)
    g = torch.Generator(device="cuda").manual_seed(1)
    data = [(torch.randn(16, 64, device="cuda", generator=g),
             torch.randn(16, 8, device="cuda", generator=g)) for _ in range(steps)]
    log = []
    err = None
    try:
        for x, y in data:
            opt.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()
            if kind == "snapshot":
                before = [p.detach().clone() for p in m.parameters()]
            else:
                with torch.no_grad():
                    for p in m.parameters():
                        if p.dim() == 2:
                            p.copy_(torch.renorm(p, 2, 0, 0.5))
            opt.step()
            if kind == "snapshot":
                log.append(torch.stack([(p.detach() - b).norm() / b.norm()
                                        for p, b in zip(m.parameters(), before)]))
    except RuntimeError as e:
        err = str(e).splitlines()[0][:160]
    return [p.detach().clone() for p in m.parameters()] + log, err


results = []
for kind in ("snapshot", "max_norm"):
    ref, e0 = run(kind, False)
    got, e1 = run(kind, True)
    if e1:
        results.append((kind, True, f"raised (acceptable): {e1}"))
    else:
        same = len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got))
        results.append((kind, same, "" if same else "differs from the plain loop, no error"))
finish(results)
