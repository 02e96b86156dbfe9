"""Does the bench's model come out the same from the CPU every time? In one
process: the rotary tables (float32 cos/sin, as build() makes them) computed
again and again, and the whole model built on the CPU again and again, each
compared bit for bit with the first. No GPU, no allocator involved.

  python3 cpu_constants_probe.py SECONDS
"""
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch_compile_decoder_bench as bench  # noqa: E402

seconds = float(sys.argv[1])
cfg = dict(bench.FULL)
max_len = max(cfg["prompts"]) + cfg["new_tokens"]
hd = cfg["dim"] // cfg["heads"]


def tables():
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.outer(torch.arange(max_len).float(), inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos(), ang.sin()


def model_digest():
    m = bench.build(torch, cfg, max_len, device="cpu")
    h = hashlib.sha256()
    for n, t in list(m.named_parameters()) + list(m.named_buffers()):
        if "cache" not in n:
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


c0, s0 = tables()
t_end = time.monotonic() + seconds / 2
n_tables = bad_tables = 0
worst = 0.0
while time.monotonic() < t_end:
    c, s = tables()
    n_tables += 1
    if not (torch.equal(c, c0) and torch.equal(s, s0)):
        bad_tables += 1
        worst = max(worst, float((c - c0).abs().max()), float((s - s0).abs().max()))
d0 = model_digest()
t_end = time.monotonic() + seconds / 2
n_models = bad_models = 0
while time.monotonic() < t_end:
    n_models += 1
    bad_models += model_digest() != d0
print(json.dumps({"threads": torch.get_num_threads(), "tables": n_tables,
                  "tables_differ": bad_tables, "worst_abs_diff": worst,
                  "models": n_models, "models_differ": bad_models,
                  "cpu": torch.backends.cpu.get_cpu_capability()}))
