"""Wakes right after sleeps, through cma.torch, with and without the wake
fence (issue 21; allocator/discard_fence.h says why the fence exists).

A state like the sleep benchmark's (444 fp32 tensors of GPT-2 12 x 1536
shapes: parameters and two AdamW moments, ~5.0 GB) plus a 4 GiB KV cache
marked disposable, on cma's default route; then `--cycles` times: sleep()
(which synchronises) and wake() at once, each timed; a wake whose copies
ran at fault speed takes seconds instead of ~0.15 s. Every tensor's first
and last element is checked after the last wake. One JSON line:

    CMA_ALLOC_CONF=managed_budget:16G,wake_fence:0 python3 torch_wake_settle_probe.py
"""
import json
import sys
import time


def shapes():
    d, v, ctx = 1536, 50257, 1024
    p = [v * d, ctx * d]
    for _ in range(12):
        p += [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]
    return p + [d, d]


def large_mappings(least=64 << 20):
    """Where the process's big host mappings live (the pinned staging among
    them): /proc/self/numa_maps lines of mappings of `least` bytes or more,
    with their page size and pages per NUMA node."""
    rows = []
    try:
        with open("/proc/self/numa_maps") as f:
            for line in f:
                fields = line.split()
                kv = dict(x.split("=", 1) for x in fields[2:] if "=" in x)
                page = int(kv.get("kernelpagesize_kB", "4")) << 10
                pages = sum(int(v) for k, v in kv.items() if k.startswith("N") and k[1:].isdigit())
                if pages * page >= least:
                    rows.append(line.strip())
    except OSError as e:
        rows.append("numa_maps unreadable: %s" % e)
    try:
        with open("/proc/self/smaps_rollup") as f:
            rows += [ln.strip() for ln in f if ln.startswith(("AnonHugePages", "Rss"))]
    except OSError:
        pass
    return rows


def main():
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    import torch
    import cma.torch as cmat
    cmat.use_as_default()
    state = []
    for k in range(3):
        for i, n in enumerate(shapes()):
            state.append(torch.full((n,), float(k * 1000 + i), device="cuda"))
    kv = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    cmat.mark_disposable(kv)
    sbytes = sum(t.numel() * 4 for t in state)
    torch.cuda.synchronize()
    out = {"tensors": len(state), "state_bytes": sbytes, "cycles": []}
    keys = ("prefetched_bytes_to_host", "prefetched_bytes_to_device", "sleep_staged_bytes",
            "sleep_restored_bytes", "discarded_bytes", "num_pages_populated", "moves",
            "host_staging_bytes.all.current", "num_placement_errors")
    for c in range(cycles):
        before = cmat.memory_stats(0)
        t0 = time.perf_counter()
        cmat.sleep()
        ts = time.perf_counter() - t0
        slept = cmat.memory_stats(0)
        if c == 0:
            out["host_mappings"] = large_mappings()
        t0 = time.perf_counter()
        cmat.wake()
        torch.cuda.synchronize()
        tw = time.perf_counter() - t0
        woke = cmat.memory_stats(0)
        out["cycles"].append({
            "sleep_s": ts, "wake_s": tw, "wake_GBps": sbytes / tw / 1e9,
            "wake_fences": woke.get("num_wake_fences"),
            "sleep_stats": {k: slept.get(k, 0) - before.get(k, 0) for k in keys},
            "last_placement_error": cmat.last_placement_error(0),
            "wake_stats": {k: woke.get(k, 0) - slept.get(k, 0) for k in keys}})
    ok = True
    for j, t in enumerate(state):
        k, i = divmod(j, len(shapes()))
        want = float(k * 1000 + i)
        ok = ok and t[0].item() == want and t[-1].item() == want
    out["contents_kept"] = ok
    print(json.dumps(out))


if __name__ == "__main__":
    main()
