"""Sleep and wake (vLLM's sleep mode, done with managed memory's
address-keeping moves) against what a user would otherwise do, in one run:

  sleep/wake      cma.torch.sleep() / wake(): every tensor to the host in one
                  batch call, the KV cache (marked disposable) discarded
  per-tensor move cma.torch.move() of each tensor (one prefetch each)
  .to() copies    t.to("cpu") of each tensor, then .to("cuda") back

on 3.2 GB of "parameters and optimizer state" (100 tensors) and a 2 GiB KV
cache. Checks: same tensors, same data_ptr, values intact after wake; and
while asleep, a second process allocates the freed memory with cudaMalloc
(PyTorch's native allocator), which cudaMemGetInfo alone would not show.

    python3 torch_sleep_bench.py --json out.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "py"))

CHILD = r"""
import sys, torch
want = int(sys.argv[1])
free, total = torch.cuda.mem_get_info()
x = torch.empty(free + want, dtype=torch.uint8, device="cuda")  # cudaMalloc, native allocator
x[-1] = 1
torch.cuda.synchronize()
print(free, free + want)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    os.environ.setdefault("CMA_ALLOC_CONF", "managed_budget:16G")
    import torch
    import cma.torch as cmat
    cmat.use_as_default()
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = [torch.randn(8 << 20, device="cuda", generator=gen) for _ in range(100)]  # 3.2 GB
    sums = [float(t.sum()) for t in params]
    ptrs = [t.data_ptr() for t in params]
    pbytes = sum(t.numel() * t.element_size() for t in params)
    out = {"param_bytes": pbytes}
    # The batch alone: parameters only, one prefetch call each way.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    cmat.sleep()
    out["params_only_sleep_GBps_to_host"] = pbytes / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    cmat.wake()
    torch.cuda.synchronize()
    out["params_only_wake_GBps_to_device"] = pbytes / (time.perf_counter() - t0) / 1e9
    kv = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]  # 2 GiB
    for t in kv:
        cmat.mark_disposable(t)
    out["kv_bytes"] = sum(t.numel() for t in kv)
    torch.cuda.synchronize()

    t0 = time.perf_counter()
    out["slept_bytes"] = cmat.sleep()
    out["sleep_s"] = time.perf_counter() - t0
    # While asleep another process takes the memory with plain cudaMalloc.
    want = int(0.9 * (pbytes + out["kv_bytes"]))
    free_now = torch.cuda.mem_get_info()[0]
    child = subprocess.run([sys.executable, "-c", CHILD, str(want)], capture_output=True,
                           text=True, timeout=120)
    out["other_process_cudamalloc_ok"] = child.returncode == 0
    out["other_process"] = child.stdout.strip() or child.stderr[-500:]
    out["free_reported_while_asleep"] = free_now
    t0 = time.perf_counter()
    cmat.wake()
    torch.cuda.synchronize()
    out["wake_s"] = time.perf_counter() - t0
    out["same_pointers"] = [t.data_ptr() for t in params] == ptrs
    out["values_intact"] = [float(t.sum()) for t in params] == sums
    out["sleep_GBps_to_host"] = pbytes / out["sleep_s"] / 1e9
    out["wake_GBps_to_device"] = pbytes / out["wake_s"] / 1e9

    # Per-tensor moves (one prefetch per tensor), the same tensors.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host = [cmat.move(t, "cpu", non_blocking=True) for t in params]
    torch.cuda.synchronize()
    out["per_tensor_move_GBps_to_host"] = pbytes / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    back = [cmat.move(h, "cuda") for h in host]
    torch.cuda.synchronize()
    out["per_tensor_move_GBps_to_device"] = pbytes / (time.perf_counter() - t0) / 1e9
    del host, back
    # .to() copies: what a user does without cma.
    t0 = time.perf_counter()
    cpu = [t.to("cpu") for t in params]
    torch.cuda.synchronize()
    out["to_copy_GBps_to_host"] = pbytes / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    gpu = [c.to("cuda") for c in cpu]
    torch.cuda.synchronize()
    out["to_copy_GBps_to_device"] = pbytes / (time.perf_counter() - t0) / 1e9
    del cpu, gpu
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    ok = out["same_pointers"] and out["values_intact"] and out["other_process_cudamalloc_ok"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
