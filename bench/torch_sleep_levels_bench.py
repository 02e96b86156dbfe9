"""Sleep and wake of a real training state, side by side in one run (issue 21):

  cma level 1   cma.torch.sleep(): kept tensors copied into pinned host
                staging kept across cycles, device pages discarded; wake
                populates them and copies back (first cycle, steady cycles)
  cma level 0   the earlier path: kept tensors migrated by one batch prefetch
  cma level 2   only tensors marked keep (the optimizer state) kept; the
                weights discarded and reloaded from a host copy after wake
  vLLM-style    PyTorch's native allocator: every tensor copied into pinned
                host buffers (kept across cycles), device memory freed;
                on wake allocated again and copied back

The state: a transformers GPT-2 (12 layers x 1536) with AdamW, parameters
and both moments (444 tensors, ~5.0 GB), plus a 4 GiB KV cache marked
disposable (vLLM-style frees and re-allocates it). Checks: the losses of a
run that slept between every step are bit-identical to a run that never
slept (deterministic algorithms), same tensors and pointers, and while asleep
another process cudaMallocs free + state + 2 GiB. GB/s count the state's
bytes (without the KV cache), as the issue does.

    python3 torch_sleep_levels_bench.py --json out.json     (the driver)
    python3 torch_sleep_levels_bench.py --role cma|vllm      (one side)
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "py"))

# The reclaim probe (another process cudaMallocs free memory + `want`): the
# same as torch_sleep_bench.py's.
from torch_sleep_bench import CHILD  # noqa: E402

STEPS_BEFORE = 2      # optimizer state exists from here on
LEVEL1_CYCLES = 4     # the first, then steady ones
LEVEL0_CYCLES = 3
LEVEL2_CYCLES = 1
KV_BYTES = 4 << 30


def setup_torch():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def build(torch):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=12, n_embd=1536, n_head=16, n_positions=1024,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     attn_implementation="eager")
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = GPT2LMHeadModel(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def batch(torch, step):
    g = torch.Generator(device="cuda").manual_seed(1000 + step)
    return torch.randint(0, 50257, (4, 256), device="cuda", generator=g)


def train_step(torch, model, opt, step):
    ids = batch(torch, step)
    loss = model(ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()  # exact float: compared bit for bit


def state_tensors(model, opt):
    out = list(model.parameters())
    for p in model.parameters():
        for k in ("exp_avg", "exp_avg_sq"):
            out.append(opt.state[p][k])
    return out


def other_process_takes(want):
    child = subprocess.run([sys.executable, "-c", CHILD, str(want)], capture_output=True,
                           text=True, timeout=120)
    return child.returncode == 0, (child.stdout.strip() or child.stderr[-400:])


def role_cma(out):
    os.environ.setdefault("CMA_ALLOC_CONF", "managed_budget:16G")
    torch = setup_torch()
    import cma.torch as cmat
    cmat.use_as_default()
    model, opt = build(torch)
    losses, step = [], 0
    for _ in range(STEPS_BEFORE):
        losses.append(train_step(torch, model, opt, step))
        step += 1
    state = state_tensors(model, opt)
    out["tensors"] = len(state)
    out["state_bytes"] = sbytes = sum(t.numel() * t.element_size() for t in state)
    kv = torch.empty(KV_BYTES, dtype=torch.uint8, device="cuda")
    cmat.mark_disposable(kv)
    out["kv_bytes"] = KV_BYTES
    ptrs = [t.data_ptr() for t in state]

    def cycle(level, label, check_other=False):
        nonlocal step
        torch.cuda.synchronize()
        staged_before = cmat.memory_stats(0)["sleep_staged_bytes"]
        t0 = time.perf_counter()
        slept = cmat.sleep(level=level)
        ts = time.perf_counter() - t0
        rec = {"label": label, "level": level, "slept_bytes": slept, "sleep_s": ts,
               "sleep_GBps": sbytes / ts / 1e9,
               "staged_bytes": cmat.memory_stats(0)["sleep_staged_bytes"] - staged_before,
               "host_staging_bytes": cmat.memory_stats(0)["host_staging_bytes.all.current"]}
        if check_other:
            free = torch.cuda.mem_get_info()[0]
            ok, said = other_process_takes(sbytes + (2 << 30))
            rec.update(free_reported_while_asleep=free, other_process_cudamalloc_ok=ok,
                       other_process=said, other_process_asked=free + sbytes + (2 << 30))
        t0 = time.perf_counter()
        cmat.wake()
        torch.cuda.synchronize()
        tw = time.perf_counter() - t0
        rec.update(wake_s=tw, wake_GBps=sbytes / tw / 1e9,
                   wake_fences=cmat.memory_stats(0).get("num_wake_fences"))
        return rec

    cycles = []
    for i in range(LEVEL1_CYCLES):
        cycles.append(cycle(1, "level1 first" if i == 0 else "level1 steady", check_other=i == 0))
        losses.append(train_step(torch, model, opt, step))
        step += 1
    for i in range(LEVEL0_CYCLES):
        cycles.append(cycle(0, "level0 (prefetch path)"))
        losses.append(train_step(torch, model, opt, step))
        step += 1
    # Level 2: the optimizer state is kept, the weights are discarded and
    # reloaded from a host copy, as a server reloads its checkpoint.
    params = list(model.parameters())
    host_weights = [p.detach().cpu() for p in params]
    for t in state[len(params):]:
        cmat.mark_keep(t)
    for i in range(LEVEL2_CYCLES):
        rec = cycle(2, "level2 (weights reloaded)")
        t0 = time.perf_counter()
        with torch.no_grad():
            for p, h in zip(params, host_weights):
                p.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        rec["reload_s"] = time.perf_counter() - t0
        cycles.append(rec)
        losses.append(train_step(torch, model, opt, step))
        step += 1
    out["cycles"] = cycles
    out["same_pointers"] = [t.data_ptr() for t in state_tensors(model, opt)] == ptrs
    kv.fill_(1)
    out["kv_usable"] = int(kv[-1].item()) == 1
    t0 = time.perf_counter()
    out["staging_released_bytes"] = cmat.release_staging()
    out["release_s"] = time.perf_counter() - t0
    out["host_staging_after_release"] = cmat.memory_stats(0)["host_staging_bytes.all.current"]
    # A first cycle again, pinning anew, in a process whose host memory has
    # grown already (no training step: the losses stay comparable).
    cycles.append(cycle(1, "level1 first after release"))
    out["losses_slept"] = losses
    # The reference: the same training, never asleep.
    del model, opt, state, kv, params, host_weights
    import gc
    gc.collect()
    model, opt = build(torch)
    ref = [train_step(torch, model, opt, s) for s in range(step)]
    out["losses_reference"] = ref
    out["losses_bit_identical"] = ref == losses


def role_vllm(out):
    torch = setup_torch()
    model, opt = build(torch)
    step = 0
    for _ in range(STEPS_BEFORE):
        train_step(torch, model, opt, step)
        step += 1
    params = list(model.parameters())
    # (owner, key): a parameter's .data, or an optimizer state entry.
    slots = [(p, None) for p in params]
    slots += [(opt.state[p], k) for p in params for k in ("exp_avg", "exp_avg_sq")]
    get = lambda o, k: o.data if k is None else o[k]  # noqa: E731

    def put(o, k, t):
        if k is None:
            o.data = t
        else:
            o[k] = t
    sbytes = sum(get(o, k).numel() * get(o, k).element_size() for o, k in slots)
    out["tensors"], out["state_bytes"] = len(slots), sbytes
    kv = torch.empty(KV_BYTES, dtype=torch.uint8, device="cuda")
    pinned = None
    cycles = []
    for i in range(LEVEL1_CYCLES):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if pinned is None:
            pinned = [torch.empty_like(get(o, k), device="cpu", pin_memory=True) for o, k in slots]
        for (o, k), h in zip(slots, pinned):
            h.copy_(get(o, k), non_blocking=True)
        torch.cuda.synchronize()
        for o, k in slots:
            put(o, k, torch.empty(0, device="cuda", dtype=get(o, k).dtype))
        del kv
        torch.cuda.empty_cache()
        ts = time.perf_counter() - t0
        free_asleep = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        for (o, k), h in zip(slots, pinned):
            t = torch.empty_like(h, device="cuda")
            t.copy_(h, non_blocking=True)
            put(o, k, t)
        kv = torch.empty(KV_BYTES, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        tw = time.perf_counter() - t0
        cycles.append({"label": "vllm first" if i == 0 else "vllm steady", "sleep_s": ts,
                       "sleep_GBps": sbytes / ts / 1e9, "wake_s": tw,
                       "wake_GBps": sbytes / tw / 1e9, "free_while_asleep": free_asleep})
        train_step(torch, model, opt, step)
        step += 1
    out["cycles"] = cycles
    out["pinned_bytes"] = sum(h.numel() * h.element_size() for h in pinned)


def run_role(role, timeout):
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--role", role],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after %d s" % timeout}
    try:
        return json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": p.stderr[-3000:], "rc": p.returncode}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    ap.add_argument("--role", default="")
    ap.add_argument("--timeout", type=int, default=150)
    a = ap.parse_args()
    if a.role:
        out = {"role": a.role}
        try:
            {"cma": role_cma, "vllm": role_vllm}[a.role](out)
        except Exception as e:  # report what was measured so far
            import traceback
            out["error"] = traceback.format_exc()[-3000:]
        print(json.dumps(out))
        return
    res = {}
    for role in ("cma", "vllm"):
        res[role] = run_role(role, a.timeout)
        if a.json:  # what is measured so far
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
