"""Replays the real PyTorch traces through torch.empty under each allocator a
PyTorch user could pick, side by side, one fresh process per route:

  native       PyTorch's caching allocator
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cma          cma.torch.use_as_default() (this library, arena mode)

Each route replays every trace twice in its process. The first pass gives
the peaks: peak requested (from the trace), peak reserved (the allocator's
own count: torch.cuda.max_memory_reserved, or cma's reserved_bytes, which
counts populated pages) and peak device use as (free at start - lowest
free) from cudaMemGetInfo after each allocation, the same instrument for
every route. The second pass, with the cache warm, gives time per operation
(Python's torch.empty/del overhead included, the same for every route).

    python3 torch_replay.py --traces a.csv.gz,b.csv.gz --json out.json
"""
import argparse
import csv
import gzip
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTES = ("native", "expandable", "cma")


def read_trace(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [(r["action"] == "alloc", int(r["addr"]), int(r["size"]), int(r["stream"]))
                for r in csv.DictReader(f)]


def replay(torch, ops, streams, sample):
    live, requested, peak_requested, lowest_free = {}, 0, 0, None
    spent, n = 0.0, 0
    for alloc, addr, size, sid in ops:
        if alloc:
            t0 = time.perf_counter()
            with torch.cuda.stream(streams[sid]):
                t = torch.empty(size, dtype=torch.uint8, device="cuda")
            spent += time.perf_counter() - t0
            n += 1
            live[addr] = (t, size)
            requested += size
            peak_requested = max(peak_requested, requested)
            if sample:
                torch.cuda.synchronize()
                free = torch.cuda.mem_get_info()[0]
                lowest_free = free if lowest_free is None else min(lowest_free, free)
        elif addr in live:
            t0 = time.perf_counter()
            t, size = live.pop(addr)
            del t
            spent += time.perf_counter() - t0
            n += 1
            requested -= size
    live.clear()
    return peak_requested, lowest_free, spent / max(n, 1) * 1e9, n


def run_route(route, traces):
    import torch
    if route == "cma":
        import cma.torch as cmat
        cmat.use_as_default()
    rows = []
    for path in traces:
        ops = read_trace(path)
        streams = {sid: (torch.cuda.default_stream() if sid == 0 else torch.cuda.Stream())
                   for sid in sorted({o[3] for o in ops})}
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        if route != "cma":  # the pluggable allocator has no PyTorch stats
            torch.cuda.reset_peak_memory_stats()
        if route == "cma":
            import cma
            cma.empty_cache()
            cma.reset_peak_stats()
        free_start = torch.cuda.mem_get_info()[0]
        peak_req, lowest, ns1, n = replay(torch, ops, streams, sample=True)
        if route == "cma":
            st = cmat.memory_stats()
            reserved = st["reserved_bytes.all.peak"]
        else:
            reserved = torch.cuda.max_memory_reserved()
        _, _, ns2, _ = replay(torch, ops, streams, sample=False)
        torch.cuda.synchronize()
        rows.append({"trace": os.path.basename(path), "route": route, "ops": n,
                     "peak_requested": peak_req, "peak_reserved": reserved,
                     "ratio": reserved / peak_req,
                     "peak_device_used": free_start - lowest,
                     "device_ratio": (free_start - lowest) / peak_req,
                     "first_pass_ns_per_op": ns1, "steady_ns_per_op": ns2})
        torch.cuda.empty_cache()
    print(json.dumps(rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=",".join(
        os.path.join(HERE, "traces", t)
        for t in ("resnet50_train.csv.gz", "kvcache_two_streams.csv.gz", "bert_train.csv.gz")))
    ap.add_argument("--json", default="")
    ap.add_argument("--route", default="")  # internal: run one route here
    a = ap.parse_args()
    traces = a.traces.split(",")
    if a.route:
        run_route(a.route, traces)
        return
    results = []
    for route in ROUTES:
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if route == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        out = subprocess.run([sys.executable, __file__, "--traces", a.traces, "--route", route],
                             env=env, capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            print(out.stderr[-3000:], file=sys.stderr)
            sys.exit(1)
        results += json.loads(out.stdout.strip().splitlines()[-1])
    print("%-28s %-11s %8s %8s %12s" % ("trace", "route", "ratio", "device", "steady_ns/op"))
    for r in results:
        print("%-28s %-11s %8.3f %8.3f %12.0f" % (r["trace"], r["route"], r["ratio"],
                                                  r["device_ratio"], r["steady_ns_per_op"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
