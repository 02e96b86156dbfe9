"""Two GPUs in one process under one route, for torch_gpu_test.py: tensors
on cuda:1 come from cma's device 1, compute correctly, and move between
devices without a copy.   python3 two_gpu_route.py default|mempool  ->  JSON"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402

route = sys.argv[1]
if route in ("default", "mempool"):
    cmat.use_as_default()
out = {"route": route}


def on(device, fn):
    if route == "mempool":
        with torch.cuda.device(device):
            p = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(p):
                return fn()
    with torch.cuda.device(device):
        return fn()


x1 = on(1, lambda: torch.arange(1 << 20, dtype=torch.float32, device="cuda:1"))
out["device_of_cuda1"] = cma.device_of(x1.untyped_storage().data_ptr())
out["compute_on_1"] = float((x1 * 2).sum().item()) == float(2 * x1.double().sum().item())
x0 = on(0, lambda: torch.ones(1 << 20, device="cuda:0"))
out["device_of_cuda0"] = cma.device_of(x0.untyped_storage().data_ptr())
if route == "default":
    ptr = x1.data_ptr()
    m = cmat.move(x1, "cuda:0")  # same memory, now used from device 0
    out["move_same_ptr"] = m.data_ptr() == ptr and m.device == torch.device("cuda:0")
    out["move_values"] = bool(torch.equal(m.cpu(), torch.arange(1 << 20, dtype=torch.float32)))
    back = cmat.move(m, "cuda:1")
    out["move_back"] = back.device == torch.device("cuda:1") and back.data_ptr() == ptr
s = cma.stats()
out["stats_devices"] = [cma.stats(d)["allocation.all.current"] > 0 for d in (0, 1)]
print(json.dumps(out))
