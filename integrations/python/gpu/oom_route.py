"""Out of memory under one allocator route, in a fresh process (the budget is
read when cma starts), for torch_gpu_test.py.

    python3 oom_route.py default|mempool  ->  JSON {raised, type, message, after_ok, ...}"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ["CMA_ALLOC_CONF"] = "managed_budget:8G"
route = sys.argv[1]

import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402

if route in ("default", "mempool"):
    cmat.use_as_default()
pool = torch.cuda.MemPool() if route == "mempool" else None


def allocate(n):
    if pool is None:
        return torch.empty(n, dtype=torch.uint8, device="cuda")
    with torch.cuda.use_mem_pool(pool):
        return torch.empty(n, dtype=torch.uint8, device="cuda")


out = {"route": route}
keep = allocate(1 << 30)
try:
    t = allocate(10 << 30)  # over the 8 GiB budget
    out.update(raised=False, data_ptr=t.data_ptr())
except torch.OutOfMemoryError as e:
    out.update(raised=True, type="torch.OutOfMemoryError", message=str(e))
except Exception as e:  # noqa: BLE001 - reported, the test fails on it
    out.update(raised=True, type=type(e).__name__, message=str(e))
# The process keeps working: a fitting allocation succeeds and computes.
after = allocate(2 << 30)
after.fill_(3)
out["after_ok"] = bool(after.data_ptr() != 0 and int(after[-1].item()) == 3)
out["keep_ok"] = keep.data_ptr() != 0
print(json.dumps(out))
