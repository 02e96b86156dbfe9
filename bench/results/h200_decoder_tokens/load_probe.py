"""Are the decoder's weights right once loaded? Builds the bench's model on
the GPU (as torch_compile_decoder_bench.py does, nothing compiled) and on the
CPU, and compares every parameter and constant buffer. For a tensor that
differs: how many elements, where the first is, whether the GPU copy is all
zeros, and whether it equals another tensor's reference bytes.

  python3 load_probe.py native|cma   (one line of JSON)
"""
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
route = sys.argv[1]
import torch_routes  # noqa: E402

torch_routes.install(route)
import torch  # noqa: E402
import torch_compile_decoder_bench as bench  # noqa: E402

cfg = dict(bench.FULL)
max_len = max(cfg["prompts"]) + cfg["new_tokens"]
torch.cuda.init()
torch.cuda.synchronize()
t0 = time.perf_counter()
gpu = bench.build(torch, cfg, max_len)
load_s = time.perf_counter() - t0
torch.cuda.synchronize()
cpu = bench.build(torch, cfg, max_len, device="cpu")


def tensors(m):
    return {n: t for n, t in list(m.named_parameters()) + list(m.named_buffers())
            if "cache" not in n}


ref = {n: t.detach().contiguous().view(-1).view(torch.uint8) for n, t in tensors(cpu).items()}
ref_sha = {hashlib.sha256(b.numpy().tobytes()).hexdigest(): n for n, b in ref.items()}
bad = {}
for n, t in tensors(gpu).items():
    got = t.detach().contiguous().view(-1).view(torch.uint8).cpu()
    if torch.equal(got, ref[n]):
        continue
    diff = (got != ref[n]).nonzero()
    sha = hashlib.sha256(got.numpy().tobytes()).hexdigest()
    bad[n] = {"bytes": got.numel(), "bytes_differ": int(diff.numel()),
              "first_byte": int(diff[0]), "last_byte": int(diff[-1]),
              "all_zero": bool((got == 0).all()), "equals_reference_of": ref_sha.get(sha)}
out = {"route": route, "tensors": len(ref), "bad": bad, "load_s": load_s}
if route == "cma":
    from cma import _lib
    st = _lib.stats(0)
    out["cma"] = {k: st.get(k) for k in ("num_pages_populated", "num_pages_discarded",
                                         "num_cross_stream_reuse", "prefetch_calls",
                                         "num_placement_errors")}
print(json.dumps(out))
