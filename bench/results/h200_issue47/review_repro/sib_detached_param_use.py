"""step_in_backward: a parameter also used through .detach() / .data in forward
(stop-gradient use of a weight whose gradient comes from another use). Its gradient
becomes final, the hint applies it at the next parameter's hook, and a LATER node
still reads the weight: .detach() -> false alarm ("modified by an inplace
operation"), .data -> silently the updated weight. Plain loop: fine."""
import _common  # noqa: F401
import torch
import cma.torch as cmat
from _common import deterministic, finish

deterministic(torch)
N = 512  # 512x512 fp32 = 1 MiB: fills a bucket_mib=1 bucket alone


class M(torch.nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.W = torch.nn.Parameter(torch.randn(N, N) * 0.05)
        self.U = torch.nn.Parameter(torch.randn(N, N) * 0.05)
        self.V = torch.nn.Parameter(torch.randn(64, N) * 0.05)

    def forward(self, x):
        z = torch.tanh(x[:, :64] @ self.V)                  # oldest nodes: run last in backward
        w = self.W.detach() if self.how == "detach" else self.W.data
        b = z @ w                                           # stop-gradient use of W (grad -> V)
        u = x @ self.U
        a = x @ self.W                                      # newest: W's gradient is final first
        return a.square().mean() + u.square().mean() + b.square().mean()


def run(how, hint, steps=5):
    torch.manual_seed(0)
    m = M(how).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    if hint:
        cmat.step_in_backward(opt, bucket_mib=1)
        # A user's logging hook on U registered after the hint; its synchronize only
        # makes the (otherwise racy) .data case deterministic.
        m.U.register_post_accumulate_grad_hook(lambda p: torch.cuda.synchronize())
    g = torch.Generator(device="cuda").manual_seed(1)
    xs = [torch.randn(16, N, device="cuda", generator=g) for _ in range(steps)]
    err = None
    try:
        for x in xs:
            opt.zero_grad()
            m(x).backward()
            opt.step()
    except RuntimeError as e:
        err = str(e).splitlines()[0][:160]
    return [p.detach().clone() for p in m.parameters()], err


results = []
for how in ("detach", "data"):
    ref, e0 = run(how, False)
    got, e1 = run(how, True)
    if e0:
        results.append((how, False, f"plain loop raised?! {e0}"))
    elif e1:
        results.append((how, False, f"hint raised in a valid loop: {e1}"))
    else:
        same = all(torch.equal(a, b) for a, b in zip(ref, got))
        results.append((how, same, "" if same else "parameters differ from the plain loop "
                        "(silent)"))
finish(results)
