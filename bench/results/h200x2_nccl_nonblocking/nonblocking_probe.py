"""On a non-blocking NCCL communicator (TORCH_NCCL_USE_COMM_NONBLOCKING=1), does
NCCL register a symmetric window at all? torch's SymmetricMemory NCCL backend
first, then cma's window; each rank prints what it got.

  TORCH_NCCL_USE_COMM_NONBLOCKING=1 NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 nonblocking_probe.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "py"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._symmetric_memory as tsm  # noqa: E402

rank = int(os.environ["RANK"])
device = torch.device("cuda", rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
out = {"rank": rank, "nonblocking_env": os.environ.get("TORCH_NCCL_USE_COMM_NONBLOCKING")}
try:
    tsm.set_backend("NCCL")
    t = tsm.empty(1 << 18, device=device)
    tsm.rendezvous(t, dist.group.WORLD.group_name)
    t.fill_(rank + 1)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    out["torch_symm"] = {"ok": True, "sum_right": bool((t == 3).all())}
except Exception as e:  # noqa: BLE001 - the probe reports it
    out["torch_symm"] = {"ok": False, "error": "%s: %s" % (type(e).__name__, str(e)[:400])}
try:
    import cma.torch
    x = cma.torch.symmetric.empty((1 << 18,), dtype=torch.float32, nccl_window=True)
    out["cma_window"] = {"ok": True}
    cma.torch.symmetric.free(x)
    cma.torch.symmetric.release_nccl_windows()
except Exception as e:  # noqa: BLE001
    out["cma_window"] = {"ok": False, "error": "%s: %s" % (type(e).__name__, str(e)[:400])}
print("PROBE", json.dumps(out), flush=True)
dist.destroy_process_group()
