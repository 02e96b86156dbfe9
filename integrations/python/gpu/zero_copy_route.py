"""cma.torch.zero_copy() under the default route, in a fresh process, for
torch_gpu_test.py: which calls alias and which copy, the aliasing semantics
(writes through either side seen by the other), nn.Module.to() round trips
keeping pointers and outputs, lifetimes (no chain of owners, memory freed
once the last alias goes).   python3 zero_copy_route.py  ->  JSON"""
import gc
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402
from cma.torch import _alias as torch_zero_copy  # noqa: E402  (the aliases' roots)

cmat.use_as_default()
out = {}
t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
ptr = t.data_ptr()
with cmat.zero_copy() as mode:
    c = t.to("cpu")
    out["to_cpu_alias"] = c.data_ptr() == ptr and c.device.type == "cpu"
    out["to_cpu_values"] = bool(torch.equal(c, torch.arange(1 << 20, dtype=torch.float32)))
    c[0] = 42.0                        # a write through the CPU alias ...
    out["write_seen_on_gpu"] = t[0].item() == 42.0   # ... is seen through the source
    g = c.cuda()
    out["cuda_alias"] = g.data_ptr() == ptr and g.device == torch.device("cuda", 0)
    g[1] = 7.0
    torch.cuda.synchronize()
    out["write_seen_on_cpu"] = c[1].item() == 7.0
    out["cpu_method_alias"] = t.cpu().data_ptr() == ptr
    out["to_tensor_alias"] = t.to(torch.empty(1)).data_ptr() == ptr  # .to(other)'s device
    aliased = mode.aliased
    # Copies, exactly as PyTorch makes them.
    copies = {
        "copy_true": t.to("cpu", copy=True),
        "dtype_change": t.to("cpu", torch.float64),
        "view": t[16:].to("cpu"),
        "non_contiguous": t.view(1024, 1024).t().to("cpu"),
        "not_cma": torch.ones(8).to("cuda"),
    }
    out["fallbacks_copy"] = {k: v.data_ptr() != ptr for k, v in copies.items()}
    out["fallback_values"] = bool(torch.equal(copies["view"], t[16:].cpu()))
    w = torch.randn(64, device="cuda", requires_grad=True)
    out["grad_recording_copies"] = w.to("cpu").grad_fn is not None
    with torch.no_grad():
        out["no_grad_aliases"] = w.to("cpu").data_ptr() == w.data_ptr()
    out["counted"] = mode.aliased == aliased + 1 and mode.copied >= len(copies) + 1
    out["same_device_is_self"] = t.to("cuda") is t
# Outside the mode .to() copies again.
out["outside_copies"] = t.to("cpu").data_ptr() != ptr

# A module's round trips: same parameters, same pointers, same outputs.
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(),
                        torch.nn.Linear(512, 512)).cuda()
x = torch.randn(32, 512, device="cuda")
ref = m(x).detach().clone()
params = list(m.parameters())
ptrs = [p.data_ptr() for p in params]
with cmat.zero_copy() as mode:
    m.to("cpu")
    m.to("cuda")
    roots = len(torch_zero_copy._roots)
    for _ in range(200):  # no chain of owners builds up
        m.to("cpu")
        m.to("cuda")
    out["roots_bounded"] = len(torch_zero_copy._roots) == roots
    out["module_same_params"] = all(a is b for a, b in zip(params, m.parameters()))
    out["module_same_pointers"] = [p.data_ptr() for p in m.parameters()] == ptrs
    out["module_requires_grad"] = all(p.requires_grad for p in m.parameters())
    out["module_output_identical"] = bool(torch.equal(m(x), ref))
    out["module_all_aliased"] = mode.copied == 0

# Lifetime: the memory goes when the source and every alias have gone.
before = cma.stats(0)["allocation.all.current"]
s = torch.ones(1 << 20, device="cuda")
with cmat.zero_copy():
    h = s.to("cpu")
del s
gc.collect()
out["alias_keeps_memory"] = (cma.stats(0)["allocation.all.current"] == before + 1 and
                             h.sum().item() == 1 << 20)
del h
gc.collect()
out["freed_with_last_alias"] = cma.stats(0)["allocation.all.current"] == before
print(json.dumps(out))
