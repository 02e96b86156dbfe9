"""One failing allocation under the default route, in a fresh process, for
torch_gpu_test.py: the error PyTorch users expect, and the process goes on.

    python3 error_route.py too_large|pytorch_huge|budget|bad_device
        -> JSON {case, type, message, after_ok}"""
import faulthandler
import json
import os
import sys

faulthandler.enable()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
case = sys.argv[1]
if case == "budget":
    os.environ["CMA_ALLOC_CONF"] = "managed_budget:4G"

import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402

cmat.use_as_default()
keep = torch.ones(1 << 20, device="cuda")
out = {"case": case}
try:
    if case == "too_large":  # 200 GB: more than the GPU has
        t = torch.empty(200_000_000_000, dtype=torch.int8, device="cuda")
    elif case == "pytorch_huge":  # PyTorch's own test_out_of_memory
        t = torch.empty(1024 * 1024 * 1024 * 800000000, dtype=torch.int8, device="cuda")
    elif case == "budget":
        t = torch.empty(6 << 30, dtype=torch.uint8, device="cuda")
    elif case == "bad_device":
        t = torch.empty(16, device="cuda:%d" % torch.cuda.device_count())
    out.update(type=None, message="no error")
except torch.OutOfMemoryError as e:
    out.update(type="torch.OutOfMemoryError", message=str(e))
except Exception as e:  # noqa: BLE001 - reported; the test decides
    out.update(type=type(e).__name__, message=str(e))
after = torch.full((1 << 20,), 3.0, device="cuda")
out["after_ok"] = bool(float((after + keep).sum().item()) == 4.0 * (1 << 20))
print(json.dumps(out))
