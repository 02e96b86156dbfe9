"""step_in_backward(free_grads=True) refuses opt.zero_grad(set_to_none=False),
but model.zero_grad(set_to_none=False) (nn.Module's, not wrapped) goes through.
A parameter a backward does not reach (a branch used on even iterations) then
keeps grad None and optimizer.step() skips it; the plain loop steps it with its
zero gradient (AdamW weight decay, moments, step count). Silent."""
import _common  # noqa: F401
import torch
import cma.torch as cmat
from _common import deterministic, finish

deterministic(torch)
N = 512


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, N)
        self.b = torch.nn.Linear(N, N)    # the branch: used on even iterations only
        self.c = torch.nn.Linear(N, 8)

    def forward(self, x, use_b):
        h = torch.tanh(self.a(x))
        if use_b:
            h = torch.tanh(self.b(h))
        return self.c(h)


def run(hint, steps=6):
    torch.manual_seed(0)
    m = M().cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    if hint:
        cmat.step_in_backward(opt, bucket_mib=1, free_grads=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    err = None
    try:
        for i in range(steps):
            x = torch.randn(16, 64, device="cuda", generator=g)
            y = torch.randn(16, 8, device="cuda", generator=g)
            m.zero_grad(set_to_none=False)
            torch.nn.functional.mse_loss(m(x, i % 2 == 0), y).backward()
            opt.step()
    except (RuntimeError, ValueError) as e:
        err = str(e).splitlines()[0][:160]
    return [p.detach().clone() for p in m.parameters()], err


ref, _ = run(False)
got, err = run(True)
if err:
    finish([("module_zero_grad_false", True, f"raised (acceptable): {err}")])
same = all(torch.equal(a, b) for a, b in zip(ref, got))
finish([("module_zero_grad_false", same, "" if same else "parameters differ, no error")])
