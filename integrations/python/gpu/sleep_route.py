"""Sleep and wake under the default route, in a fresh process, for
torch_gpu_test.py: same tensors and pointers, values kept, disposable memory
usable again.   python3 sleep_route.py  ->  JSON"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402

cmat.use_as_default()
w = torch.randn(32 << 20, device="cuda")  # 128 MiB
kv = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
cmat.mark_disposable(kv)
ref, ptr = w.sum().item(), w.data_ptr()
out = {"slept": cmat.sleep()}
out["woke"] = cmat.wake()
out["same_pointer"] = w.data_ptr() == ptr
out["values_kept"] = w.sum().item() == ref
kv.fill_(1)
out["disposable_usable"] = int(kv[-1].item()) == 1
print(json.dumps(out))
