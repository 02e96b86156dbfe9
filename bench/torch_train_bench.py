"""A real training loop under each allocator a PyTorch user could pick, side
by side, one fresh process per route: a BERT-style encoder (transformers'
BertForMaskedLM built from a config, random weights), batch size and
sequence length drawn per step from a seeded generator, AdamW, bf16
autocast, deterministic kernels.

  native       PyTorch's caching allocator
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cma          cma.torch.use_as_default()
  cma_pool     cma.torch.pool() under torch.cuda.use_mem_pool

Reported per route: every loss (identical across routes, or the run fails),
median step time after warm-up, and peak device memory as (free at start -
lowest free) from cudaMemGetInfo after every step, the same instrument for
every route; plus the allocator's own peak reserved.

    python3 torch_train_bench.py --steps 40 --rounds 3 --json out.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROUTES = ("native", "expandable", "cma", "cma_pool")
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


def run_route(route, steps):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    if route == "cma":
        import cma.torch as cmat
        cmat.use_as_default()
    free_start = torch.cuda.mem_get_info()[0]
    lowest = [free_start]

    def sample():
        torch.cuda.synchronize()
        lowest[0] = min(lowest[0], torch.cuda.mem_get_info()[0])

    if route == "cma_pool":
        import cma.torch as cmat
        pool = cmat.pool()
        with torch.cuda.use_mem_pool(pool):
            losses, times = train(steps, sample)
    else:
        losses, times = train(steps, sample)
    out = {"route": route, "losses": losses, "steps": steps, "step_ms": times,
           "step_ms_median": statistics.median(times[10:]),
           "peak_device_used": free_start - lowest[0]}
    if route != "cma":  # the pluggable allocator has no PyTorch stats
        out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        out["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    if route.startswith("cma"):
        import cma.torch as cmat
        st = cmat.memory_stats()
        out["cma"] = {k: st[k] for k in CMA_KEYS}
    print(json.dumps(out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", default="")
    ap.add_argument("--route", default="")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--routes", default=",".join(ROUTES),
                    help="comma-separated routes to compare (the first is the baseline)")
    a = ap.parse_args()
    if a.route:
        run_route(a.route, a.steps)
        return
    routes = a.routes.split(",")
    # Step times drift between processes on a shared machine by more than the
    # differences between routes: the routes run interleaved, round after
    # round, and each route's figure is the median over its rounds.
    rounds = {route: [] for route in routes}
    for _ in range(a.rounds):
        for route in routes:
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if route == "expandable":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            if route.startswith("cma"):
                env.setdefault("CMA_ALLOC_CONF", "managed_budget:16G")
            out = subprocess.run([sys.executable, __file__, "--steps", str(a.steps), "--route",
                                  route], env=env, capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                print(out.stderr[-3000:], file=sys.stderr)
                sys.exit(1)
            rounds[route].append(json.loads(out.stdout.strip().splitlines()[-1]))
    runs = {}
    for route, rs in rounds.items():
        runs[route] = dict(rs[0])
        runs[route]["round_step_ms_median"] = [r["step_ms_median"] for r in rs]
        runs[route]["step_ms_median"] = statistics.median(r["step_ms_median"] for r in rs)
        runs[route]["peak_device_used"] = max(r["peak_device_used"] for r in rs)
    base = runs[routes[0]]
    identical = all(r["losses"] == base["losses"] for rs in rounds.values() for r in rs)
    print("losses identical across routes and rounds:", identical)
    print("%-11s %12s %14s %12s   %s" % ("route", "step_ms", "peak_device", "vs_" + routes[0],
                                         "per-round step_ms"))
    for r in runs.values():
        print("%-11s %12.2f %11.2f GiB %12.3f   %s" % (
            r["route"], r["step_ms_median"], r["peak_device_used"] / 2**30,
            r["step_ms_median"] / base["step_ms_median"],
            " ".join("%.1f" % t for t in r["round_step_ms_median"])))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"identical_losses": identical, "runs": runs}, f, indent=1)
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
