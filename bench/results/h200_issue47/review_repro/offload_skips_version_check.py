"""Activation offload: with cma's saved-tensor hooks pushed, autograd skips its
version-counter check for EVERY saved tensor (SavedVariable::unpack checks only
`if (!hooks_)`), including those cma's pack passes through (< 1 MiB, or past the
step's budget). So
  (a) the CPU switch's H8 fix (alias shares the source's version counter, a
      refilled staging buffer must raise at backward) is defeated: the gradient is
      silently computed from the refilled data;
  (b) an in-place write to a saved activation (PyTorch raises "modified by an
      inplace operation") is silently accepted.
Setup as offload_patterns_route.py: oversubscribe:1, CMA_ACTIVATION_OFFLOAD forced."""
import os
import _common  # noqa: F401
os.environ["CMA_ACTIVATION_OFFLOAD"] = str(1 << 20)
import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402
from cma.torch.training import offload as torch_offload  # noqa: E402
from _common import deterministic, finish  # noqa: E402

cmat.use_as_default("oversubscribe:1")
deterministic(torch)
W, ROWS = 1024, 64  # a (64, 1024) fp32 input is 256 KiB: cma's pack passes it through


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(W, W), torch.nn.GELU(),
                               torch.nn.Linear(W, W)).cuda()


m = model()
opt = torch.optim.SGD(m.parameters(), lr=0.1)
m(torch.randn(ROWS, W, device="cuda")).square().mean().backward()
opt.step()   # cma's optimizer hooks see the device: the offloader exists
opt.zero_grad()
cmat.activation_offload(True)
results = []
if not torch_offload.hooks_installed():
    finish([("setup", False, "offload hooks not installed (oversubscribe:1 not seen?)")])

# (a) H8 under the offload
cmat.managed_cpu()
try:
    g = torch.Generator().manual_seed(5)
    first, second = torch.randn(ROWS, W, generator=g), torch.randn(ROWS, W, generator=g)
    ref = model()
    ref.load_state_dict(m.state_dict())
    staging = torch.empty(ROWS, W)
    staging.copy_(first)
    xg = staging.to("cuda")
    alias = xg.data_ptr() == staging.data_ptr()
    loss = m(xg).square().mean()
    torch.cuda.synchronize()
    staging.copy_(second)   # refilled before backward
    try:
        loss.backward()
        ref(first.to("cuda", copy=True)).square().mean().backward()
        same = all(torch.equal(p.grad, q.grad) for p, q in zip(m.parameters(), ref.parameters()))
        results.append(("h8_refill_under_offload", False,
                        f"alias={alias}; no error; gradients "
                        f"{'equal' if same else 'silently computed from the refilled buffer'}"))
    except RuntimeError as e:
        ok = "modified by an inplace operation" in str(e)
        results.append(("h8_refill_under_offload", ok, "" if ok else str(e)[:160]))
finally:
    cmat.managed_cpu(False)
m.zero_grad()

# (b) in-place write to a saved activation: PyTorch raises without hooks
class Bad(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(W, W), torch.nn.Linear(W, W)

    def forward(self, x):
        h = torch.relu(self.l1(x))   # relu saves its result h (256 KiB)
        out = self.l2(h)
        h.add_(1.0)                  # in place on a saved tensor
        return out


def bad_raises(offload):
    cmat.activation_offload(offload)
    torch.manual_seed(0)
    b = Bad().cuda()
    try:
        b(torch.randn(ROWS, W, device="cuda")).square().mean().backward()
        return False
    except RuntimeError as e:
        return "modified by an inplace operation" in str(e)


plain, off = bad_raises(False), bad_raises(True)
results.append(("inplace_on_saved_raises_under_offload", plain and off,
                f"plain raises={plain}, with offload raises={off}"))
finish(results)
