"""One training run under one allocator route, for torch_gpu_test.py.

    python3 train_route.py native|default|mempool  ->  JSON {losses, step_ms, ...}
Deterministic settings, so every route must give the same losses."""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
route = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 50

import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402

if route in ("default", "mempool"):
    cmat.use_as_default()
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.benchmark = False
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def run():
    import torchvision
    model = torchvision.models.resnet18(num_classes=10).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(64, 3, 64, 64, generator=g), torch.randint(0, 10, (64,), generator=g))
            for _ in range(4)]
    losses, times = [], []
    for step in range(steps):
        x, y = data[step % len(data)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    return losses, times


if route == "mempool":
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        losses, times = run()
else:
    losses, times = run()
out = {"route": route, "losses": losses, "step_ms_median": statistics.median(times[10:])}
if route != "native":
    st = cmat.memory_stats()
    out["cma_stats"] = st
    out["cma"] = {k: st[k] for k in ("num_device_alloc", "num_device_free", "num_sync_all_streams",
                                     "prefetch_calls", "reserved_bytes.all.peak",
                                     "requested_bytes.all.peak")}
    out["config"] = os.environ.get("CMA_ALLOC_CONF", "")
print(json.dumps(out))
