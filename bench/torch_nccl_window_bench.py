"""All-reduce on NCCL symmetric windows: cma's symmetric tensors registered as
windows of torch's NCCL communicator, beside torch's own SymmetricMemory
NCCL backend and beside ordinary buffers, in the same processes.

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 torch_nccl_window_bench.py OUT.json

Checks first (every rank): an all-reduce on a cma window gives the right sum;
freeing the tensor and asking for the same size again reuses the allocation
and its window (no NCCL registration: the heap's statistics say so);
release_nccl_windows lets go of them. Then latency of dist.all_reduce (sum,
float32, in place) at 8 KiB to 64 MiB for three buffers: `plain` (torch's
caching allocator, what users have), `torch_symm` (torch's SymmetricMemory
with set_backend("NCCL"): ncclMemAlloc and a symmetric window) and
`cma_window` (cma.torch.symmetric.empty(nccl_window=True)), two ways:
`eager`, dist.all_reduce called `iters` times back to back (what a Python
loop gets: at these sizes ProcessGroupNCCL's per-call CPU cost, about 35 us
on an H200 host, hides the kernel), and `graph`, the same `iters` calls
captured in a CUDA graph (afresh every round) and replayed (the collective itself). Each
timing is the mean over the `iters` calls between CUDA events; rounds
interleave the three buffers in a rotating order, and the figure is the
median over rounds; ratios are medians of each round's cma/peer pair. Rank 0 writes OUT.json; the exit code is the check.

    ... torch_nccl_window_bench.py OUT.json probe   (one all-reduce per buffer,
        for NCCL_DEBUG=INFO logs)
"""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "py"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SIZES = [8 << 10, 32 << 10, 128 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
# CMA_BENCH_MAX_BYTES: only the sizes up to it (more rounds of the small ones).
SIZES = [s for s in SIZES if s <= int(os.environ.get("CMA_BENCH_MAX_BYTES", str(SIZES[-1])))]
ROUNDS = int(os.environ.get("CMA_BENCH_ROUNDS", "15"))


def iters_for(nbytes):
    return 400 if nbytes <= (256 << 10) else 100 if nbytes <= (4 << 20) else 25


def time_allreduce(buf, iters):
    for _ in range(5):
        dist.all_reduce(buf)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    dist.barrier()
    start.record()
    for _ in range(iters):
        dist.all_reduce(buf)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters  # microseconds per all-reduce


def capture_allreduce(buf, iters):
    """`iters` in-place all-reduces of `buf` captured in a CUDA graph, after a warm-up."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(buf)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            dist.all_reduce(buf)
    return g


# A capture fixes what its replays cost (run 4 of bench/results/h200x2_nccl_windows: the same
# buffer's graph differed by a quarter between captures, steady across replays), so each round
# captures afresh. CMA_BENCH_CAPTURE_ONCE restores the old way (runs 2-4): one capture per buffer
# and size, kept in _captured_once and replayed every round.
CAPTURE_ONCE = os.environ.get("CMA_BENCH_CAPTURE_ONCE") is not None
_captured_once = {}  # (buffer name, elements) -> its graph; filled only under CAPTURE_ONCE


def time_allreduce_graph(name, buf, iters):
    if CAPTURE_ONCE:
        key = (name, buf.numel())
        if key not in _captured_once:
            _captured_once[key] = capture_allreduce(buf, iters)
        g = _captured_once[key]
    else:
        g = capture_allreduce(buf, iters)
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    dist.barrier()
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def main(out_path, probe=False):
    import cma.torch
    sm = cma.torch.symmetric
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    group = dist.group.WORLD
    largest = max(SIZES) // 4  # float32 elements
    results = {"world": world, "torch": torch.__version__,
               "nccl": ".".join(map(str, torch.cuda.nccl.version())),
               "nvls": os.environ.get("NCCL_NVLS_ENABLE", "unset"), "rounds": ROUNDS}
    checks = {}

    # ---- correctness and caching of cma windows
    t0 = time.perf_counter()
    x = sm.empty((largest,), dtype=torch.float32, nccl_window=True)
    results["cma_first_window_ms"] = (time.perf_counter() - t0) * 1e3
    heap = sm._heap(None, rank)
    x.fill_(float(rank + 1))
    dist.all_reduce(x)
    checks["sum"] = bool(torch.all(x == float(world * (world + 1) // 2)).item())
    checks["one_window"] = heap.stats()["windows"] == 1
    sm.free(x)
    t0 = time.perf_counter()
    x = sm.empty((largest,), dtype=torch.float32, nccl_window=True)  # cached, window and all
    results["cma_cached_empty_with_window_us"] = (time.perf_counter() - t0) * 1e6
    checks["cached_window"] = heap.stats()["windows"] == 1 and heap.stats()["cache_hits"] >= 1
    x.fill_(1.0)
    dist.all_reduce(x)
    checks["sum_after_reuse"] = bool(torch.all(x == float(world)).item())
    reps = 50
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        sm.free(x)
        x = sm.empty((largest,), dtype=torch.float32, nccl_window=True)
    results["cma_cached_free_empty_with_window_us"] = (time.perf_counter() - t0) * 1e6 / reps

    # ---- the three buffers
    buffers = {"plain": torch.empty(largest, dtype=torch.float32, device=device),
               "cma_window": x}
    try:
        import torch.distributed._symmetric_memory as tsm
        tsm.set_backend("NCCL")
        y = tsm.empty((largest,), dtype=torch.float32, device=device)
        tsm.rendezvous(y, group)
        buffers["torch_symm"] = y
        if os.environ.get("CMA_BENCH_CONTROL"):
            # A second window of torch's: torch_symm_b/torch_symm is an A/A ratio, the spread
            # two identical windows show on this machine.
            z = tsm.empty((largest,), dtype=torch.float32, device=device)
            tsm.rendezvous(z, group)
            buffers["torch_symm_b"] = z
    except Exception as e:  # noqa: BLE001 - reported beside cma's figures
        results["torch_symm_error"] = repr(e)[:400]
    for name, buf in buffers.items():  # every buffer computes the same sum
        v = buf[: 1 << 16]
        v.fill_(float(rank + 1))
        dist.all_reduce(v)
        checks[f"sum_{name}"] = bool(torch.all(v == float(world * (world + 1) // 2)).item())
    names = sorted(buffers)
    if probe:
        results["probe"] = True
        ROUNDS_USED, modes = 0, []
    else:
        ROUNDS_USED, modes = ROUNDS, ["eager", "graph"]
    for mode in modes:
        samples = {n: {s: [] for s in SIZES} for n in names}
        for r in range(ROUNDS_USED):
            for s in SIZES:
                order = names[r % len(names):] + names[: r % len(names)]
                for n in order:
                    view = buffers[n][: s // 4]
                    try:
                        us = (time_allreduce(view, iters_for(s)) if mode == "eager"
                              else time_allreduce_graph(n, view, iters_for(s)))
                    except Exception as e:  # noqa: BLE001 - reported, the rest goes on
                        results.setdefault("errors", []).append(f"{mode} {n} {s}: {e!r}"[:300])
                        us = float("nan")
                    samples[n][s].append(us)
        table = {n: {str(s): statistics.median(v) for s, v in samples[n].items()} for n in names}
        results[f"allreduce_us_median_{mode}"] = table
        # Paired: each round's cma figure over the same round's peer (drift
        # in the machine cancels), then the median over rounds.
        results[f"ratios_{mode}"] = {
            str(s): {f"cma_window/{n}": statistics.median(
                c / p for c, p in zip(samples["cma_window"][s], samples[n][s]))
                for n in names if n != "cma_window"} for s in SIZES}
        if "torch_symm_b" in samples:
            for s in SIZES:
                results[f"ratios_{mode}"][str(s)]["torch_symm_b/torch_symm"] = statistics.median(
                    b / a for b, a in zip(samples["torch_symm_b"][s], samples["torch_symm"][s]))
    _captured_once.clear()  # CMA_BENCH_CAPTURE_ONCE's graphs, freed before the windows' release

    # ---- release before the communicator goes
    released = sm.release_nccl_windows()
    checks["released"] = released == 1 and heap.stats()["windows"] == 0
    sm.free(x)
    gathered = [None] * world
    dist.all_gather_object(gathered, checks)
    results["checks"] = gathered
    ok = all(all(c.values()) for c in gathered)
    results["check_all_ranks"] = ok
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
        print(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return ok


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1], probe=sys.argv[2:] == ["probe"]) else 1)
