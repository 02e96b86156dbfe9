"""Decoder inference under torch.compile(mode="reduce-overhead") with a
static KV cache, per route (native, expandable segments, cma's default
route), one fresh process per route and round, rounds interleaved with the
order rotated (torch_routes.py).

The model is written here (no transformers version to depend on): a
Llama-like decoder (RMSNorm, rotary embeddings, multi-head attention
through scaled_dot_product_attention with a mask over the cache, SwiGLU), random weights from a fixed
seed, bf16. Its KV cache is one static buffer per layer (marked as a static
address, written in place with index_copy_), so a step's only inputs are
the tokens and their positions. One compiled function with dynamic=False
serves three shapes: prefill of a short and of a long prompt, and the
one-token decode step. That makes three CUDA graphs that cudagraph trees
record into one shared memory pool, the case issue 20 asks for.

Each request: prefill a batch of prompts, then decode --new-tokens greedily.
Requests alternate between the two prompt lengths; the first requests of
each length (compile, warm-up, graph recording) are not timed. Reported per
route, medians over rounds with ratios to native and to expandable: decode
tokens/s (batch x tokens / decode time), decode step time, prefill time,
time to the first timed request (compile included), device physical peak
(free after CUDA initialises minus the lowest free, an NVML sampler process
polling every ~1 ms) and the allocator's own peak reserved where it reports
one. Checks: the generated tokens are identical across routes and rounds,
and so are the weights and constant buffers as loaded (a digest right after
loading and one at the end: tokens that differ with the weights equal point
at the run, with the weights different at the load); no cudagraph was
skipped; graphs were captured.

On the GPU machine, from a folder made by bench/gpu/package.sh:
    PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so \\
      python3 torch_compile_decoder_bench.py --rounds 3 --json OUT/torch_decoder.json
writes OUT/torch_decoder.json and OUT/torch_decoder.txt (the table). Before
the rounds one untimed native process fills inductor's cache, so that no
measured process compiles from nothing. --quick: one round, a small model.
A route R+mempool (native, expandable or cma, named in --routes) serves
inside torch.cuda.use_mem_pool(torch.cuda.MemPool()).
"""
import argparse
import hashlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_routes  # noqa: E402

FULL = dict(vocab=32000, dim=1024, layers=4, heads=16, ffn=2816, batch=8,
            prompts=(128, 384), new_tokens=128, requests=6)
QUICK = dict(vocab=8192, dim=512, layers=2, heads=8, ffn=1408, batch=4,
             prompts=(32, 96), new_tokens=16, requests=2)


def build(torch, cfg, max_len, device="cuda", dtype=None):
    nn, F = torch.nn, torch.nn.functional
    hd = cfg["dim"] // cfg["heads"]

    class RMSNorm(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * \
                self.weight

    def rope(x, cos, sin):  # x [B, H, T, hd]; cos, sin [T, hd]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            d, h = cfg["dim"], cfg["heads"]
            self.attn_norm, self.mlp_norm = RMSNorm(d), RMSNorm(d)
            self.wq = nn.Linear(d, h * hd, bias=False)
            self.wk = nn.Linear(d, h * hd, bias=False)
            self.wv = nn.Linear(d, h * hd, bias=False)
            self.wo = nn.Linear(h * hd, d, bias=False)
            self.gate = nn.Linear(d, cfg["ffn"], bias=False)
            self.up = nn.Linear(d, cfg["ffn"], bias=False)
            self.down = nn.Linear(cfg["ffn"], d, bias=False)
            shape = (cfg["batch"], h, max_len, hd)
            self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
            self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

        def forward(self, x, cos, sin, mask, pos):
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q = self.wq(h).view(b, t, cfg["heads"], hd).transpose(1, 2)
            k = self.wk(h).view(b, t, cfg["heads"], hd).transpose(1, 2)
            v = self.wv(h).view(b, t, cfg["heads"], hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
            x = x + self.wo(o.transpose(1, 2).reshape(b, t, -1))
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["layers"]))
            self.norm = RMSNorm(cfg["dim"])
            self.lm_head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
            inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2).float() / hd))
            ang = torch.outer(torch.arange(max_len).float(), inv)
            ang = torch.cat((ang, ang), dim=-1)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
            self.register_buffer("slots", torch.arange(max_len), persistent=False)

        def forward(self, tokens, pos):
            """tokens [B, T] at positions pos [T] -> the greedy next token [B]."""
            x = self.embed(tokens)
            cos, sin = self.cos[pos].to(x.dtype), self.sin[pos].to(x.dtype)
            mask = (self.slots[None, :] <= pos[:, None])[None, None]  # [1, 1, T, max_len]
            for layer in self.layers:
                x = layer(x, cos, sin, mask, pos)
            logits = self.lm_head(self.norm(x[:, -1])).float()
            return logits.argmax(-1)

    torch.manual_seed(0)  # built on the CPU: the same weights whatever the device
    model = Decoder().to(device=device, dtype=dtype or torch.bfloat16).eval()
    if device == "cuda":
        for layer in model.layers:  # what a static cache needs under cudagraphs
            torch._dynamo.mark_static_address(layer.k_cache)
            torch._dynamo.mark_static_address(layer.v_cache)
    return model


def constants_digest(torch, model):
    """sha256 prefix of the weights and constant buffers (not the KV cache):
    the same on every route and round unless something overwrote them."""
    h = hashlib.sha256()
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "cache" in name:
                continue
            h.update(name.encode())
            h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def route_main(a):
    cfg = dict(QUICK if a.small else FULL)
    # Deterministic kernels: the token check compares routes and rounds, and
    # greedy decoding of a random-weight model sits near ties, so run-to-run
    # reduction order changed native's own tokens between rounds
    # (bench/results/h200_torch_allocator/torch_decoder.txt, first run).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch_routes.install(a.route)
    import torch
    if a.keep_cache:
        # torch.cuda.graph empties the cache before every capture; this
        # takes that call (and its discards under cma) out of the run.
        torch.cuda.empty_cache = lambda: None
    torch.use_deterministic_algorithms(True)
    import torch._inductor.config as inductor_config
    if hasattr(inductor_config, "deterministic"):
        inductor_config.deterministic = True
    torch.cuda.init()
    torch.cuda.synchronize()
    sampler = torch_routes.PeakSampler(torch_routes.cuda_bus_id(torch))
    sampler.start()
    t_start = time.perf_counter()
    captures = [0]
    try:  # count the CUDA graphs cudagraph trees capture
        graph_cls = torch.cuda.CUDAGraph
        orig_end = graph_cls.capture_end

        def counted_end(self, *args, **kw):
            captures[0] += 1
            return orig_end(self, *args, **kw)
        graph_cls.capture_end = counted_end
    except (AttributeError, TypeError):  # not a Python class here: the count is unknown
        captures[0] = None
    max_len = max(cfg["prompts"]) + cfg["new_tokens"]
    if torch_routes.in_mempool(a.route):
        # Serving inside a user's MemPool: everything this thread allocates
        # from here on (weights, cache, the graphs' inputs) is the pool's,
        # while cudagraph trees record into pools of their own.
        mempool = torch.cuda.MemPool()
        torch.cuda.use_mem_pool(mempool).__enter__()  # for the process's life
    model = build(torch, cfg, max_len)
    constants_at_start = constants_digest(torch, model)
    step = torch.compile(model, mode="reduce-overhead", dynamic=False, fullgraph=True)
    g = torch.Generator().manual_seed(1)
    slots = torch.arange(max_len, device="cuda")
    b, n_new = cfg["batch"], cfg["new_tokens"]
    out = torch.empty(b, n_new, dtype=torch.long, device="cuda")
    # The decode step's inputs: buffers of our own, aligned, the same every
    # step (a view into `out` would be misaligned at odd steps).
    cur = torch.empty(b, 1, dtype=torch.long, device="cuda")
    pos = torch.empty(1, dtype=torch.long, device="cuda")
    n_warm = 2 * len(cfg["prompts"])  # each shape: warm-up, then recording
    decode_tps, decode_ms, prefill_ms, digests, first = [], [], [], [], None
    with torch.no_grad():
        for r in range(n_warm + cfg["requests"]):
            plen = cfg["prompts"][r % len(cfg["prompts"])]
            prompt = torch.randint(0, cfg["vocab"], (b, plen), generator=g).cuda()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            nxt = step(prompt, slots[:plen])
            out[:, 0].copy_(nxt)
            cur[:, 0].copy_(nxt)  # before the next replay overwrites nxt
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for i in range(1, n_new):
                pos.copy_(slots[plen + i - 1:plen + i])
                nxt = step(cur, pos)
                out[:, i].copy_(nxt)
                cur[:, 0].copy_(nxt)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            digests.append(hashlib.sha256(out.cpu().numpy().tobytes()).hexdigest()[:16])
            if r < n_warm:
                continue
            if first is None:
                first = t0 - t_start
            prefill_ms.append((t1 - t0) * 1e3)
            decode_ms.append((t2 - t1) * 1e3 / (n_new - 1))
            decode_tps.append(b * (n_new - 1) / (t2 - t1))
    torch.cuda.synchronize()
    peak = sampler.stop()
    constants_at_end = constants_digest(torch, model)
    metrics = {"decode_tokens_per_s": statistics.median(decode_tps),
               "decode_step_ms": statistics.median(decode_ms),
               "prefill_ms": statistics.median(prefill_ms),
               "time_to_first_timed_request_s": first,
               "peak_sampled_MiB": peak["peak"] / 2**20 if "peak" in peak else None}
    try:  # the pluggable route raises here; PyTorch's own and a c10 allocator answer
        metrics["max_reserved_MiB"] = torch.cuda.max_memory_reserved() / 2**20
    except (RuntimeError, AttributeError):
        pass
    problems = []
    if "error" in peak:
        problems.append("peak sampler: " + peak["error"])
    skips = None
    try:
        from torch._dynamo.utils import counters
        skips = dict(counters["inductor"]).get("cudagraph_skips", 0)
    except ImportError:
        pass
    if skips:
        problems.append("torch.compile skipped cudagraphs %d times: the run is not what it "
                        "claims to measure" % skips)
    if captures[0] is not None and captures[0] < len(cfg["prompts"]) + 1:
        problems.append("only %d CUDA graphs captured (expected %d shapes)" % (
            captures[0], len(cfg["prompts"]) + 1))
    counters = None
    if torch_routes.base_route(a.route) == "cma":  # what cma did to pages, to set beside the token check
        try:
            from cma import _lib as cma_lib
            st = cma_lib.stats(0)
            counters = {k: st.get(k) for k in (
                "num_pages_populated", "num_pages_discarded", "discard_calls",
                "num_discard_waits", "num_sync_all_streams", "num_cross_stream_reuse",
                "num_placement_errors", "prefetch_calls")}
        except Exception as e:  # the check is advisory
            counters = {"error": "%s: %s" % (type(e).__name__, e)}
    torch_routes.emit({"route": a.route, "metrics": metrics, "config": cfg,
                       "cma_counters": counters,
                       "check": {"tokens_sha256_16": digests,
                                 "constants_sha256_16": [constants_at_start, constants_at_end]},
                       "per_request": {"decode_tokens_per_s": decode_tps, "decode_step_ms":
                                       decode_ms, "prefill_ms": prefill_ms},
                       "graphs_captured": captures[0], "cudagraph_skips": skips,
                       "sampler": peak, "problems": problems})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    torch_routes.add_common_args(ap, rounds=3, timeout_s=120, budget_s=235)
    ap.add_argument("--small", action="store_true", help="the small model (--quick sets it)")
    ap.add_argument("--no-prepare", action="store_true",
                    help="skip the untimed process that fills inductor's cache")
    ap.add_argument("--keep-cache", action="store_true",
                    help="torch.cuda.empty_cache does nothing in the measured processes (an "
                         "experiment: the captures' empty_cache calls taken out)")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.small = 1, True
    if a.route:
        route_main(a)
        return
    routes = a.routes.split(",")

    def argv_for(route, k):
        return [sys.executable, os.path.abspath(__file__), "--route", route, "--round-index",
                str(k)] + (["--small"] if a.small else []) + (
                    ["--keep-cache"] if a.keep_cache else [])

    if not a.no_prepare:  # compile everything once, outside the measured processes
        warm = torch_routes.run_rounds(argv_for, ["native"], 1, 2 * a.timeout, a.budget,
                                       started=torch_routes.STARTED)
        if warm["failures"]["native"]:
            print("[bench] the cache-filling native process failed (see above); going on",
                  file=sys.stderr)
    torch_routes.prepare_routes(routes, torch_routes.remaining(a.budget, 300))
    run = torch_routes.run_rounds(argv_for, routes, a.rounds, a.timeout, a.budget,
                                  started=torch_routes.STARTED)
    metrics = [("decode_tokens_per_s", "tok/s"), ("decode_step_ms", "ms"), ("prefill_ms", "ms"),
               ("time_to_first_timed_request_s", "s"), ("peak_sampled_MiB", "MiB"),
               ("max_reserved_MiB", "MiB")]
    sys.exit(torch_routes.finish("torch_compile_decoder_bench", a, run, routes, metrics, a.json))


if __name__ == "__main__":
    main()
