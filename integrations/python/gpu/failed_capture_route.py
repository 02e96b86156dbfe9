"""A CUDA graph capture that fails, then ordinary work, under one route, in a
fresh process, for torch_gpu_test.py. PyTorch's CUDAGraph.capture_end raises
on an invalidated capture before it ends the allocator's pool context; cma
must not stay in its capture-safe mode for good (cma/torch/_ext/capture_watch.h).

    python3 failed_capture_route.py native|default  ->  JSON of checks"""
import faulthandler
import json
import os
import sys

faulthandler.enable()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
route = sys.argv[1]
import torch  # noqa: E402

if route == "default":
    import cma.torch as cmat  # noqa: E402
    cmat.use_as_default()
from route_checks import make_check  # noqa: E402

out = {"route": route}
check = make_check(out)
x = torch.ones(1 << 20, device="cuda")
s = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        y = x * 2
        y.sum().item()  # a sync inside the capture invalidates it
    out["capture_error"] = None
except Exception as e:  # noqa: BLE001 - the failure is the point
    out["capture_error"] = type(e).__name__
del g


@check("a new allocation is resident at once (PyTorch's test_device_memory_used)")
def _():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.device_memory_used()
    t = torch.empty(512 << 20, dtype=torch.int8, device="cuda")
    torch.cuda.synchronize()
    grew = (torch.cuda.device_memory_used() - before) >> 20
    del t
    return True if grew >= 256 else f"NVML's memory in use grew by {grew} MiB"


@check("record_stream's block is reused after its stream finished")
def _():
    side = torch.cuda.Stream()
    a = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    with torch.cuda.stream(side):
        a.add_(1)
    a.record_stream(side)
    ptr = a.data_ptr()
    del a
    torch.cuda.synchronize()
    b = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    return True if b.data_ptr() == ptr else "the block was not reused"


@check("a later capture replays")
def _():
    g2 = torch.cuda.CUDAGraph()
    static = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.graph(g2):
        res = static * 3
    static.fill_(2)
    g2.replay()
    torch.cuda.synchronize()
    return True if float(res.sum().item()) == 6 * 1024 else "wrong replay"


print(json.dumps(out))
