"""Experiment (issue 30): how fast do the copy engines move cma's host-tier
memory (managed, preferred location host, accessed by the device) to and
from device memory, one way and both ways at once, against pinned memory
and against a kernel reading it in place? Settles whether the staged
optimizer step can beat reading the state over the link.
    CMA_LIBRARY=... PYTHONPATH=py python3 host_tier_copy_experiment.py  -> JSON"""
import json
import time

import torch
import cma.torch as cmat

cmat.use_as_default("oversubscribe:1")
N = 1 << 30
dev = torch.cuda.current_device()
with cmat.host_tier():
    host = torch.ones(N // 4, device="cuda")
    host2 = torch.ones(N // 4, device="cuda")
pinned = torch.ones(N // 4, pin_memory=True)
pinned2 = torch.ones(N // 4, pin_memory=True)
d1, d2 = torch.empty(N // 4, device="cuda"), torch.empty(N // 4, device="cuda")
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()


def timed(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        t.append(time.perf_counter() - t0)
    return sorted(t)[len(t) // 2]


def both(a_dst, a_src, b_dst, b_src):
    def f():
        with torch.cuda.stream(s1):
            a_dst.copy_(a_src, non_blocking=True)
        with torch.cuda.stream(s2):
            b_dst.copy_(b_src, non_blocking=True)
    return f


gb = N / 1e9
out = {"on_host": cmat._lib.placed_on_host(host.data_ptr())}
out["tier_h2d_GBps"] = gb / timed(lambda: d1.copy_(host, non_blocking=True))
out["tier_d2h_GBps"] = gb / timed(lambda: host.copy_(d1, non_blocking=True))
out["tier_both_GBps_each"] = gb / timed(both(d1, host, host2, d2))
out["pinned_h2d_GBps"] = gb / timed(lambda: d1.copy_(pinned, non_blocking=True))
out["pinned_d2h_GBps"] = gb / timed(lambda: pinned.copy_(d1, non_blocking=True))
out["pinned_both_GBps_each"] = gb / timed(both(d1, pinned, pinned2, d2))
out["foreach_copy_both_GBps_each"] = gb / timed(lambda: torch._foreach_copy_([d1, host2], [host, d2]))
out["foreach_copy_h2d_GBps"] = gb / timed(lambda: torch._foreach_copy_([d1], [host]))
from cma import torch_staged_step as tss  # noqa: E402
for mib in (1, 4, 16):
    tss._PIECE_BYTES = mib << 20
    out[f"interleaved_{mib}MiB_both_GBps_each"] = gb / timed(
        lambda: tss._copy([(d1, host)], [(host2, d2)]))
out["kernel_inplace_rw_GBps_each"] = gb / timed(lambda: host.mul_(1.0000001))
print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}))
