"""Activation offload pushes its saved-tensor hooks at the outermost module's
forward; torch.func transforms (vmap, grad, vjp, jacrev, jvp) called INSIDE a
forward (model ensembling via vmap(functional_call), jacobian terms, per-head
vmap) then hit disable_saved_tensors_hooks with a non-empty stack and raise
"torch.func transforms don't yet support saved tensor hooks". Plain: fine."""
import os
import _common  # noqa: F401
os.environ["CMA_ACTIVATION_OFFLOAD"] = str(1 << 20)
import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402
from cma.torch.training import offload as torch_offload  # noqa: E402
from _common import deterministic, finish  # noqa: E402

cmat.use_as_default("oversubscribe:1")
deterministic(torch)
W = 1024


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(W, W)
        self.heads = torch.nn.Parameter(torch.randn(4, W, 64) * 0.02)

    def forward(self, x):
        h = torch.tanh(self.l(x))
        per_head = torch.func.vmap(lambda w: h @ w)(self.heads)   # (4, rows, 64)
        return per_head.square().mean()


def run(offload):
    torch.manual_seed(0)
    m = M().cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    g = torch.Generator(device="cuda").manual_seed(1)
    err = None
    for i in range(3):
        if i == 1:
            cmat.activation_offload(offload)
        try:
            opt.zero_grad()
            m(torch.randn(512, W, device="cuda", generator=g)).backward()
            opt.step()
        except RuntimeError as e:
            err = str(e).splitlines()[0][:160]
            break
    cmat.activation_offload(False)
    return [p.detach().clone() for p in m.parameters()], err, torch_offload.hooks_installed()


ref, e0, _ = run(False)
got, e1, _ = run(True)
if e1:
    finish([("vmap_inside_forward", False, f"raised with the offload on: {e1}")])
same = e0 is None and all(torch.equal(a, b) for a, b in zip(ref, got))
finish([("vmap_inside_forward", same, "" if same else f"differs (plain err {e0})")])
