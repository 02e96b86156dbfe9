"""PyTorch's memory tools under cma's default route, in a fresh process, for
torch_gpu_test.py: torch.cuda.memory_stats()/memory_summary()/max_memory_*()
/reset_peak_memory_stats() and memory._snapshot() rendered by
torch.cuda._memory_viz.   python3 memory_tools_route.py OUTDIR  ->  JSON"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma.torch as cmat  # noqa: E402

cmat.use_as_default()
out = {}
torch.cuda.memory._record_memory_history(max_entries=10000)
keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1000, 3 << 20, 50 << 20)]
tmp = torch.empty(8 << 20, device="cuda")
del tmp
s = torch.cuda.memory_stats()
out["stats_keys_ok"] = all(k in s for k in ("allocated_bytes.all.current", "reserved_bytes.all.peak",
                                            "num_ooms", "active.all.current"))
out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
out["memory_reserved"] = torch.cuda.memory_reserved()
summary = torch.cuda.memory_summary()
out["summary_ok"] = "Allocated memory" in summary and "GPU reserved memory" in summary
torch.cuda.reset_peak_memory_stats()
out["peak_after_reset"] = torch.cuda.max_memory_allocated()
snap = torch.cuda.memory._snapshot()
out["segments"] = len(snap["segments"])
out["trace_entries"] = len(snap["device_traces"][0])
from torch.cuda import _memory_viz  # noqa: E402
outdir = sys.argv[1] if len(sys.argv) > 1 else "."
for name, fn in (("segment_plot", _memory_viz.segment_plot), ("trace_plot", _memory_viz.trace_plot)):
    html = fn(snap)
    out[name + "_bytes"] = len(html)
    with open(os.path.join(outdir, name + ".html"), "w") as f:
        f.write(html)
out["segsum"] = _memory_viz.segsum(snap).splitlines()[:3]
print(json.dumps(out))
