"""What PyTorch's memory plots read from a snapshot, in a fresh process (the
first allocations of the process are the ones recorded), for
torch_gpu_test.py:

    python3 memory_plots_route.py cma|native  ->  JSON

For each way of recording (context and stacks as torch.cuda.memory.
_record_memory_history takes them): a 64 KiB tensor made and freed, then
memory_viz's trace plot (also with filter_freed, which drops the freed
allocations' events from the snapshot it is given), its segment plot, and
whether the snapshot still names the tensor's size and the function that
made it. PyTorch's snapshot keeps a free block's last requested size; so
must cma's.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
if sys.argv[1] == "cma":
    import cma.torch as cmat
    cmat.use_as_default()
import torch  # noqa: E402
from torch.cuda._memory_viz import segment_plot, trace_plot  # noqa: E402

SIZE = 128 * 128 * 4


def make_and_drop():
    t = torch.ones(128, 128, device="cuda")
    (t + t).sum()


out = {"route": sys.argv[1], "runs": []}
for context, stacks in (("all", "all"), ("all", "python"), (None, "python")):
    try:
        torch.cuda.memory.empty_cache()
        torch.cuda.memory._record_memory_history("all", context=context, stacks=stacks)
        make_and_drop()
        ss = torch.cuda.memory._snapshot()
        trace_plot(ss)
        trace_plot(ss, filter_freed=True)
        segment_plot(ss)
        text = json.dumps(ss)
        out["runs"].append({
            "context": context, "stacks": stacks,
            "size_named": str(SIZE) in text,
            "maker_named": "make_and_drop" in text,
            "free_blocks": [(b["size"], b["requested_size"]) for s in ss["segments"]
                            for b in s["blocks"] if b["state"] == "inactive"][:8]})
    finally:
        torch.cuda.memory._record_memory_history(None)
print(json.dumps(out))
