"""Does a CUDA graph capture that fails leave cma quiet for good? PyTorch's
CUDAGraph.capture_end raises on an invalidated capture before it ends the
allocator's pool context, so the context stays open. Then PyTorch's
test_device_memory_used steps (a live 512 MiB torch.empty must raise NVML's
device memory in use).
    python3 failed_capture_probe.py cma|native   (bundle root on PYTHONPATH)"""
import json
import sys

import torch

route = sys.argv[1]
if route == "cma":
    import cma.torch as cmat
    cmat.use_as_default()
torch.cuda.init()
x = torch.ones(1 << 20, device="cuda")
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
failed = ""
try:
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            y = x * 2
            y.sum().item()  # a sync inside a capture invalidates it
except Exception as e:  # noqa: BLE001
    failed = type(e).__name__ + ": " + str(e).splitlines()[0][:160]
del g
torch.cuda.synchronize()
torch.cuda.empty_cache()
a = torch.cuda.device_memory_used()
t = torch.empty(512 << 20, dtype=torch.int8, device="cuda")
torch.cuda.synchronize()
torch.cuda.empty_cache()
b = torch.cuda.device_memory_used()
print(json.dumps({"route": route, "capture_error": failed,
                  "nvml_delta_MiB": (b - a) / (1 << 20)}))
