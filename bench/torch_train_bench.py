"""A real training loop under each allocator a PyTorch user could pick, side
by side, one fresh process per route and round, rounds interleaved with the
route order rotated (torch_routes.py): a BERT-style encoder (transformers'
BertForMaskedLM built from a config, random weights), batch size and
sequence length drawn per step from a seeded generator, AdamW, bf16
autocast, deterministic kernels.

  native       PyTorch's caching allocator
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cma          cma.torch.use_as_default()
  cma_pool     cma.torch.pool() under torch.cuda.use_mem_pool (not run
               unless named in --routes)
  R+mempool    route R (native, expandable, cma) with the loop inside
               torch.cuda.use_mem_pool(torch.cuda.MemPool()) (named in --routes)

Reported per route, medians over rounds, with ratios to native and to
expandable: step time (median of the steps after warm-up), device physical
peak sampled every ~1 ms by a separate NVML process (free when the loop
starts minus the lowest free seen; torch_routes.PeakSampler), the same peak
from cudaMemGetInfo after every step, and the allocator's own peak reserved
where it reports one. Every loss must be identical across routes and rounds,
or the run fails.

On the GPU machine, from a folder made by bench/gpu/package.sh:
    PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so \\
      python3 torch_train_bench.py --steps 40 --rounds 3 --json OUT/torch_train.json
writes OUT/torch_train.json (every step's loss and time, per round) and
OUT/torch_train.txt (the table). --quick: one round of 12 steps.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_routes  # noqa: E402

CMA_KEYS = ("reserved_bytes.all.peak", "requested_bytes.all.peak", "num_device_alloc",
            "num_pages_populated", "num_pages_discarded", "num_sync_all_streams",
            "prefetch_calls", "prefetched_bytes_to_device", "advise_calls",
            "num_cross_stream_reuse")


def train(steps, after_step):
    """The training loop every route runs: returns (losses, step times in ms);
    after_step() runs after each step, outside the timing."""
    import torch
    import transformers
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = transformers.BertConfig(hidden_size=768, num_hidden_layers=12,
                                  num_attention_heads=12, intermediate_size=3072,
                                  max_position_embeddings=512, attn_implementation="eager")
    model = transformers.BertForMaskedLM(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    losses, times = [], []
    for step in range(steps):
        batch = int(torch.randint(4, 17, (1,), generator=g))
        seq = 64 * int(torch.randint(1, 9, (1,), generator=g))
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ids = ids.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
        after_step()
    return losses, times


def run_route(a):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    route = a.route
    torch_routes.install("native" if route in ("cma_pool",) else route)
    import torch
    torch.cuda.init()
    torch.cuda.synchronize()
    sampler = torch_routes.PeakSampler(torch_routes.cuda_bus_id(torch))
    free_start = torch.cuda.mem_get_info()[0]
    sampler.start()
    lowest = [free_start]

    def sample():
        torch.cuda.synchronize()
        lowest[0] = min(lowest[0], torch.cuda.mem_get_info()[0])

    if route == "cma_pool" or torch_routes.in_mempool(route):
        if route == "cma_pool":
            import cma.torch as cmat
            pool = cmat.pool()
        else:
            pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            losses, times = train(a.steps, sample)
    else:
        losses, times = train(a.steps, sample)
    torch.cuda.synchronize()
    peak = sampler.stop()
    warm = min(10, len(times) // 2)
    metrics = {"step_ms": statistics.median(times[warm:]),
               "peak_sampled_MiB": peak["peak"] / 2**20 if "peak" in peak else None,
               "peak_per_step_MiB": (free_start - lowest[0]) / 2**20}
    problems = []
    if "error" in peak:
        problems.append("peak sampler: " + peak["error"])
    try:  # the pluggable route raises here; PyTorch's own and a c10 allocator answer
        metrics["max_reserved_MiB"] = torch.cuda.max_memory_reserved() / 2**20
        metrics["max_allocated_MiB"] = torch.cuda.max_memory_allocated() / 2**20
    except (RuntimeError, AttributeError):
        pass
    out = {"route": route, "metrics": metrics, "check": {"losses": losses}, "steps": a.steps,
           "step_ms": times, "sampler": peak, "problems": problems}
    if route.startswith("cma"):
        try:
            import cma.torch as cmat
            st = cmat.memory_stats()
            out["cma"] = {k: st.get(k) for k in CMA_KEYS}
        except Exception as e:  # noqa: BLE001 - a figure less, not a failed run
            out["cma"] = {"error": str(e)[:300]}
    torch_routes.emit(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    torch_routes.add_common_args(ap, rounds=3, timeout_s=120, budget_s=140)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.steps = 1, 12
    if a.route:
        run_route(a)
        return
    routes = a.routes.split(",")
    torch_routes.prepare_routes(routes, torch_routes.remaining(a.budget, 300))
    run = torch_routes.run_rounds(
        lambda route, k: [sys.executable, os.path.abspath(__file__), "--route", route,
                          "--round-index", str(k), "--steps", str(a.steps)],
        routes, a.rounds, a.timeout, a.budget, started=torch_routes.STARTED)
    metrics = [("step_ms", "ms"), ("peak_sampled_MiB", "MiB"), ("peak_per_step_MiB", "MiB"),
               ("max_reserved_MiB", "MiB"), ("max_allocated_MiB", "MiB")]
    sys.exit(torch_routes.finish("torch_train_bench", a, run, routes, metrics, a.json))


if __name__ == "__main__":
    main()
