"""Sleep levels under the default route, in a fresh process, for
torch_gpu_test.py: level 1 keeps values and the staging (reported, reused,
given back), level 2 keeps only what is marked keep, level 0 still works,
and bad input is refused.   python3 sleep_levels_route.py  ->  JSON"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402

cmat.use_as_default()
w = torch.randn(48 << 20, device="cuda")            # 192 MiB: weights
opt = torch.randn(16 << 20, device="cuda")          # 64 MiB: state to keep at level 2
kv = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
cmat.mark_disposable(kv)
cmat.mark_keep(opt)
ref_w, ref_opt = w.clone().cpu(), opt.clone().cpu()
checks = {}
staging = lambda: cmat.memory_stats(0)["host_staging_bytes.all.current"]  # noqa: E731
cmat.sleep()
checks["staging_held"] = staging() == w.numel() * 4 + opt.numel() * 4
cmat.wake()
torch.cuda.synchronize()
checks["level1_values"] = torch.equal(w.cpu(), ref_w) and torch.equal(opt.cpu(), ref_opt)
checks["staging_kept_after_wake"] = staging() > 0
for _ in range(3):
    cmat.sleep()
    cmat.wake()
checks["steady_cycles_values"] = torch.equal(w.cpu(), ref_w)
staged = lambda: cmat.memory_stats(0)["sleep_staged_bytes"]  # noqa: E731
before = staged()
cmat.sleep(level=2)
checks["level2_stages_only_marked"] = staged() - before == opt.numel() * 4
try:
    cmat.release_staging()
    checks["release_refused_while_asleep"] = False
except cma.CmaError as e:
    checks["release_refused_while_asleep"] = "wake" in str(e)
cmat.wake()
torch.cuda.synchronize()
checks["level2_keeps_marked"] = torch.equal(opt.cpu(), ref_opt)
w.copy_(ref_w.cuda())  # the user reloads
cmat.sleep(level=0)
cmat.wake()
torch.cuda.synchronize()
checks["level0_values"] = torch.equal(w.cpu(), ref_w)
released = cmat.release_staging()
checks["released"] = released > 0 and staging() == 0
try:
    cmat.sleep(level=7)
    checks["bad_level_refused"] = False
except cma.CmaError as e:
    checks["bad_level_refused"] = "level 7" in str(e)
print(json.dumps({"checks": checks, "released": released}))
