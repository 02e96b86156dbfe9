"""PyTorch's view of h2d_order_experiment.cu: a conversion kernel queued
behind a delay reads a temporary; the temporary is freed and its block
taken again at once (a caching allocator's reuse on the same stream); a
copy from pageable CPU memory fills the new tensor. In stream order the
conversion sees the old values.

  python3 h2d_order_probe.py native|cma
"""
import json
import sys

route = sys.argv[1]
if route == "cma":
    import cma.torch as cmat
    cmat.use_as_default()
import torch  # noqa: E402

n = 16 << 20  # 64 MiB of float32
x1 = torch.full((n,), 1.0)
x2 = torch.full((n,), 2.0)
bad, reps, same_block = 0, 10, 0
for r in range(reps):
    t = torch.empty(n, device="cuda")
    t.copy_(x1)
    torch.cuda._sleep(50_000_000)  # ~25-30 ms of GPU time queued first
    y = t.to(torch.bfloat16)       # the conversion, queued behind the delay
    ptr = t.data_ptr()
    del t
    t2 = torch.empty(n, device="cuda")
    same_block += t2.data_ptr() == ptr
    t2.copy_(x2)                   # pageable host memory into the reused block
    torch.cuda.synchronize()
    bad += int((y != 1.0).sum().item() > 0)
    del t2, y
print(json.dumps({"route": route, "reps": reps, "reused_block": same_block,
                  "conversions_that_saw_the_later_copy": bad}))
