"""What PyTorch's test_device_memory_used sees under cma and native: NVML's
device memory in use (torch.cuda.device_memory_used) and cudaMemGetInfo's,
after a 512 MiB torch.empty and after writing it.
    python3 device_memory_used_probe.py cma|native   (bundle root on PYTHONPATH)"""
import json
import sys

import torch

route = sys.argv[1]
if route == "cma":
    import cma.torch as cmat
    cmat.use_as_default()
torch.cuda.init()
torch.cuda.synchronize()
torch.cuda.empty_cache()
free0, _ = torch.cuda.mem_get_info()
nvml0 = torch.cuda.device_memory_used()
x = torch.empty(512 << 20, dtype=torch.int8, device="cuda")
torch.cuda.synchronize()
torch.cuda.empty_cache()
free1, _ = torch.cuda.mem_get_info()
nvml1 = torch.cuda.device_memory_used()
x.fill_(1)
torch.cuda.synchronize()
free2, _ = torch.cuda.mem_get_info()
nvml2 = torch.cuda.device_memory_used()
MiB = 1 << 20
print(json.dumps({"route": route,
                  "nvml_MiB_after_empty": (nvml1 - nvml0) / MiB,
                  "nvml_MiB_after_write": (nvml2 - nvml0) / MiB,
                  "memgetinfo_MiB_after_empty": (free0 - free1) / MiB,
                  "memgetinfo_MiB_after_write": (free0 - free2) / MiB}))
