"""Offloading code that calls .to(), unmodified, with copies and with
cma.torch.zero_copy() (issue 21): a transformers GPT-2 whose blocks live on
the host and are moved to the GPU for their forward and back afterwards (the
pattern of accelerate's CPU offload, with the move back), by forward hooks
that call block.to("cuda") and block.to("cpu").

  copies     PyTorch's native allocator; the model starts on the host; each
             .to() copies (pageable memory, as the model's own tensors are)
  zero-copy  the default route (cma) and `with cma.torch.zero_copy():`; the
             same hooks; each .to() returns an alias placed by prefetch

Reported: time per forward step (mean of the timed steps after one warm-up),
and peak device memory over a separate instrumented step, measured as
(free at the process's start - lowest free) from cudaMemGetInfo after every
block, the same instrument for both; the outputs of both ways are compared.
Managed pages that migrated to the host may stay counted as used by
cudaMemGetInfo while the driver can still hand them out, so the zero-copy
side also has another process cudaMalloc free + 90% of the blocks' bytes
once they are all on the host.

    python3 torch_offload_bench.py --json out.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "py"))

LAYERS, WIDTH, STEPS = 12, 2048, 4


def build(torch):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=LAYERS, n_embd=WIDTH, n_head=16, n_positions=1024,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).eval()


CHILD = r"""
import sys, torch
free, total = torch.cuda.mem_get_info()
x = torch.empty(free + int(sys.argv[1]), dtype=torch.uint8, device="cuda")
x[-1] = 1
torch.cuda.synchronize()
"""


def role(zero):
    import torch
    if zero:
        import cma.torch as cmat
        cmat.use_as_default()
    torch.cuda.init()
    start_free = torch.cuda.mem_get_info()[0]
    model = build(torch)
    blocks = list(model.transformer.h)
    mode = None
    if zero:
        model.cuda()  # every tensor a cma allocation of its own
        mode = cmat.zero_copy()
        mode.__enter__()
        for b in blocks:
            b.to("cpu")  # aliases: pages migrated to the host
    else:
        model.transformer.wte.cuda()
        model.transformer.wpe.cuda()
        model.transformer.ln_f.cuda()
    torch.cuda.synchronize()
    block_bytes = sum(p.numel() * p.element_size() for b in blocks for p in b.parameters())
    probe = {"on": False, "low": None}

    def pre(m, args):
        m.to("cuda")

    def post(m, args, output):
        if probe["on"]:
            torch.cuda.synchronize()
            probe["low"] = min(probe["low"], torch.cuda.mem_get_info()[0])
        m.to("cpu")
    for b in blocks:
        b.register_forward_pre_hook(pre)
        b.register_forward_hook(post)
    ids = torch.randint(0, 50257, (4, 512), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        logits = model(ids).logits  # warm-up
        torch.cuda.synchronize()
        times = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            logits = model(ids).logits
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        probe.update(on=True, low=torch.cuda.mem_get_info()[0])
        model(ids)
        torch.cuda.synchronize()
        after_free = torch.cuda.mem_get_info()[0]
    out = {"step_s": sum(times) / len(times), "steps_s": times,
           "block_bytes_moved_each_way": block_bytes,
           "peak_device_bytes": start_free - probe["low"],
           "device_bytes_after_step": start_free - after_free,
           "logits_sum": float(logits.double().sum()), "logits_head": logits[0, 0, :4].tolist()}
    out["GBps_each_way"] = 2 * block_bytes / out["step_s"] / 1e9
    if mode is not None:
        out["aliased"], out["copied"] = mode.aliased, mode.copied
        mode.__exit__(None, None, None)
        child = subprocess.run([sys.executable, "-c", CHILD, str(int(0.9 * block_bytes))],
                               capture_output=True, text=True, timeout=120)
        out["other_process_takes_offloaded_blocks"] = child.returncode == 0
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--role", default="")
    ap.add_argument("--timeout", type=int, default=240)
    a = ap.parse_args()
    if a.role:
        try:
            out = role(a.role == "zero")
        except Exception:
            import traceback
            out = {"error": traceback.format_exc()[-3000:]}
        print(json.dumps(out))
        return
    res = {}
    for r in ("copy", "zero"):
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--role", r],
                               capture_output=True, text=True, timeout=a.timeout)
            res[r] = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            res[r] = {"error": p.stderr[-3000:], "rc": p.returncode}
        except subprocess.TimeoutExpired:
            res[r] = {"error": "timed out after %d s" % a.timeout}
        if a.json:  # what is measured so far
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    if "logits_sum" in res.get("copy", {}) and "logits_sum" in res.get("zero", {}):
        res["same_logits"] = (res["copy"]["logits_sum"] == res["zero"]["logits_sum"] and
                              res["copy"]["logits_head"] == res["zero"]["logits_head"])
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
