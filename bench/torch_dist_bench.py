"""PyTorch DDP and FSDP2 on two GPUs under each allocator (issue 49 items 1
and 3): step time, per-rank physical peak, bit-identity of the losses, and
NCCL's bus bandwidth on tensors the route's allocator made.

Routes (each job a fresh `python -m torch.distributed.run --standalone
--nproc_per_node 2` of this file; the allocator is chosen before CUDA
initialises, as in torch_routes.py):
  native        PyTorch's caching allocator
  expandable    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cma           cma.torch.use_as_default() (CMA_ALLOC_CONF as set, else
                torch_routes' default managed_budget:16G: set a larger one
                for larger models)
  cma_oversub   (item 3, fsdp2 only) cma with --oversub-conf, beside a
                blocker per GPU (oversub_blocker.py) that leaves free only
                peak / --ratio + --ctx-mib, peak: native FSDP2's per-rank
                physical peak of the same model (or --peak-gib)
  fsdp2_cpu_offload  (item 3, fsdp2 only) native allocator, FSDP2 with
                CPUOffloadPolicy(), the same blockers
Modes: ddp (DistributedDataParallel) and fsdp2 (fully_shard per block and
the root). Models: gpt2 (fp32, LayerNorm, GELU, learned positions) and
llama (RMSNorm, SwiGLU, rotary; bf16 autocast over fp32 weights), both
written here in plain torch with eager attention, built on the host from
one seed, AdamW (--adamw fused|foreach). Deterministic kernels, TF32 off
and fixed tokens seeded per rank, so the losses (all-reduced mean, compared
as float.hex()) can be bit-identical across routes.

Per job, per rank: step times (cuda synchronize + an all-reduce barrier
around each step), the device's physical peak from torch_routes.PeakSampler
on that rank's own device (an NVML process; local rank = device index),
torch.cuda.max_memory_reserved/allocated where the route reports them and
cma's own stats. One BENCH_RESULT line per rank (ranks in turn).

--collectives: instead of training, all_reduce, reduce_scatter_tensor and
all_gather_into_tensor from --coll-min-mib to --coll-max-mib, tensors made
by the route's allocator (managed memory under cma), bus bandwidth with
NCCL-tests' formulas over the slowest rank's time (CUDA events).

Every child gets NCCL_NVLS_ENABLE=0 and CMA_DISABLE_MULTICAST=1 (no
multicast objects). On the GPU machine, cma importable and CMA_LIBRARY set:
    python3 bench/torch_dist_bench.py --json OUT/dist.json --log-dir OUT/logs
    python3 bench/torch_dist_bench.py --collectives --json OUT/coll.json
    python3 bench/torch_dist_bench.py --mode fsdp2 --routes native,cma_oversub,fsdp2_cpu_offload
writes the JSON (every rank's figures) and the markdown tables (NAME.md).
bench/results/dist_call.sh is a whole call. Sizes: --layers --width
--heads --ffn --vocab --batch --seq. The parent imports no torch.
"""
import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oversub_blocker as ob  # noqa: E402
import torch_dist_report as rep  # noqa: E402
import torch_routes  # noqa: E402
from oversub_report import cma_conf  # noqa: E402
from torch_train_bench import CMA_KEYS  # noqa: E402

BASE_ROUTES = ("native", "expandable", "cma")
ITEM3_ROUTES = ("cma_oversub", "fsdp2_cpu_offload")  # blocked GPUs, fsdp2 only
MODES, MODELS = ("ddp", "fsdp2"), ("gpt2", "llama")
OPS = ("all_reduce", "reduce_scatter", "all_gather")
SIZES = ("layers", "width", "heads", "ffn", "vocab", "batch", "seq", "steps", "warmup",
         "adamw", "coll_min_mib", "coll_max_mib", "coll_factor", "coll_warmup", "coll_iters")
GiB, MiB = ob.GiB, ob.MiB


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routes", default=",".join(BASE_ROUTES),
                    help="comma-separated: %s" % ", ".join(BASE_ROUTES + ITEM3_ROUTES))
    ap.add_argument("--mode", default=",".join(MODES), help="ddp, fsdp2")
    ap.add_argument("--model", default=",".join(MODELS), help="gpt2, llama")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (GPUs)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=0,
                    help="MLP width (0: 4w for gpt2, ~8w/3 for llama)")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--batch", type=int, default=4, help="per rank")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6, help="timed steps after --warmup")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--adamw", choices=("fused", "foreach"), default="fused")
    ap.add_argument("--collectives", action="store_true", help="bus bandwidth instead of training")
    ap.add_argument("--coll-min-mib", type=float, default=1)
    ap.add_argument("--coll-max-mib", type=float, default=1024)
    ap.add_argument("--coll-factor", type=int, default=4)
    ap.add_argument("--coll-warmup", type=int, default=5)
    ap.add_argument("--coll-iters", type=int, default=20)
    ap.add_argument("--ratio", type=float, default=1.5, help="item 3: GPU free = peak / ratio")
    ap.add_argument("--peak-gib", type=float, default=0,
                    help="item 3: per-rank in-memory peak (default: native fsdp2's of the model)")
    ap.add_argument("--ctx-mib", type=int, default=1024,
                    help="item 3: left free beside peak / ratio for the CUDA context and NCCL")
    ap.add_argument("--oversub-conf",
                    default="oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G",
                    help="cma_oversub's CMA_ALLOC_CONF; {budget_gib}: peak / ratio + half "
                    "of MemAvailable / ranks")
    ap.add_argument("--tol-mib", type=int, default=64, help="the blockers leave free +- this")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per job")
    ap.add_argument("--record-trace", default="",
                    help="a folder: each rank's allocation trace (bench/traces/ format) there")
    ap.add_argument("--json", default="")
    ap.add_argument("--md", default="", help="the tables (default: the JSON path with .md)")
    ap.add_argument("--log-dir", default="", help="every job's stdout and stderr here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.route_list, a.mode_list = a.routes.split(","), a.mode.split(",")
    a.model_list = a.model.split(",")
    bad = ([r for r in a.route_list if r not in BASE_ROUTES + ITEM3_ROUTES] +
           [m for m in a.mode_list if m not in MODES] +
           [m for m in a.model_list if m not in MODELS])
    if bad or a.width % a.heads:
        ap.error("unknown %s or --width not a multiple of --heads" % bad)
    return a


# ---------------------------------------------------------------- the parent

def job_env(route, nproc=2, conf=None, base=None):
    """A job's environment: the route's allocator (torch_routes.route_env),
    deterministic cuBLAS, no NVLS or multicast anywhere."""
    env = torch_routes.route_env("native" if route == "fsdp2_cpu_offload" else route, base)
    env.update(NCCL_NVLS_ENABLE="0", CMA_DISABLE_MULTICAST="1",
               CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONUNBUFFERED="1")
    # torchrun sets 1 thread per rank otherwise: the host AdamW of
    # fsdp2_cpu_offload and the model's host init would crawl.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // nproc)))
    if conf:
        env["CMA_ALLOC_CONF"] = conf
    return env


def job_argv(a, route, mode, model, collectives=False):
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(a.nproc), os.path.abspath(__file__), "--worker",
            "--routes", route, "--mode", mode, "--model", model]
    for k in SIZES:
        argv += ["--" + k.replace("_", "-"), str(getattr(a, k))]
    if a.record_trace:
        argv += ["--record-trace", a.record_trace]
    return argv + (["--collectives"] if collectives else [])


def parse_results(stdout):
    """Every rank's BENCH_RESULT line, in order; a line prefix torchrun may
    add (its log_line_prefix_template, "[rank1]:") is skipped."""
    p = torch_routes.RESULT_PREFIX
    return [json.loads(ln[ln.index(p) + len(p):]) for ln in stdout.splitlines() if p in ln]


def run_job(argv, env, timeout, log_path="", log=None):
    """One torchrun in its own process group, output to files (no pipe to
    fill). Past `timeout`: SIGTERM (torchrun stops its workers), then
    SIGKILL to the group."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        p = subprocess.Popen(argv, env=env, stdout=fo, stderr=fe, start_new_session=True)
        rc = None
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout after %.0f s" % timeout
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        fo.seek(0)
        fe.seek(0)
        out, err = fo.read(), fe.read()
    if log_path:
        with open(log_path, "w") as f:
            f.write("$ %s\n--- stdout\n%s\n--- stderr\n%s" % (" ".join(argv), out, err))
    results = parse_results(out)
    status = "ok" if rc == 0 and results else "failed (rc %s)" % rc
    job = {"status": status, "rc": rc, "results": results,
           "wall_s": round(time.monotonic() - t0, 1)}
    if status != "ok":
        job["stderr_tail"] = err[-3000:]
    print("[dist] %s: %s in %.1f s" % (" ".join(argv[argv.index("--routes") + 1:][:5]),
                                      status, job["wall_s"]), file=log or sys.stderr)
    return job


def oversub_plan(a, peak_bytes, avail):
    """Item 3's GPU free per rank and cma_oversub's CMA_ALLOC_CONF."""
    data = int(peak_bytes / a.ratio)
    return {"peak_bytes": peak_bytes, "ratio": a.ratio, "data_free": data,
            "blocker_free": data + a.ctx_mib * MiB,
            "conf": cma_conf(a.oversub_conf, data, avail / a.nproc)}


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds every finally: the job and the blockers die


def parent(a, argv):
    # every child inherits these, prepare_routes' and the blockers' too: no multicast objects
    os.environ.update(NCCL_NVLS_ENABLE="0", CMA_DISABLE_MULTICAST="1")
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    doc = {"bench": "torch_dist_bench", "argv": sys.argv[:1] + list(argv or sys.argv[1:]),
           "args": {k: v for k, v in vars(a).items()}, "world": a.nproc, "jobs": [],
           "rows": [], "coll": {}, "coll_routes": [], "notes": [],
           "env": {"gpu": ob.gpu_facts(0), "mem_available": ob.mem_available()}}
    json_path = a.json
    md_path = a.md or (os.path.splitext(a.json)[0] + ".md" if a.json else "")
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)

    def save():
        if json_path:
            with open(json_path, "w") as f:
                json.dump(doc, f, indent=1)
        if md_path:
            with open(md_path, "w") as f:
                f.write(rep.markdown(doc))

    def job(route, mode, model, conf=None, extra=None):
        name = "coll_" + route if a.collectives else "%s_%s_%s" % (mode, model, route)
        # The job's whole footprint on each GPU, from before torchrun starts:
        # every process's CUDA contexts (also one a rank makes on another
        # rank's GPU), NCCL's buffers and the allocator's memory. The ranks'
        # own samplers start at their loop, after their contexts.
        gpus = [torch_routes.PeakSampler("", index=d) for d in range(a.nproc)]
        for g in gpus:
            g.start()
        try:
            j = run_job(job_argv(a, route, mode, model, a.collectives),
                        job_env(route, a.nproc, conf), a.timeout,
                        os.path.join(a.log_dir, name + ".log") if a.log_dir else "")
        finally:
            peaks = [g.stop() for g in gpus]
        j["gpu_peak_MiB"] = [p["peak"] / MiB if "peak" in p else None for p in peaks]
        j.update(route=route, mode=mode, model=model, world=a.nproc, **(extra or {}))
        doc["jobs"].append(j)
        if j["status"] != "ok":
            doc["notes"].append("%s: %s: %s" % (name, j["status"], _last_error(j)))
        return j

    # cma's extension is built on first use: once here, not in every rank of a job
    prep = torch_routes.prepare_routes(sorted({"cma" for r in a.route_list if r.startswith("cma")}),
                                       a.timeout)
    doc["notes"] += ["preparing cma failed: %s" % e[-300:] for e in prep.values()]
    if a.collectives:
        doc["coll_routes"] = [r for r in a.route_list if r in BASE_ROUTES]
        for route in doc["coll_routes"]:
            doc["coll"][route] = rep.summarize_coll(job(route, "ddp", "gpt2"))  # mode unused
            save()
    else:
        for model in a.model_list:
            for mode in a.mode_list:
                for route in _order(a.route_list, mode):
                    if route in ITEM3_ROUTES:
                        j = _blocked_job(a, doc, job, route, mode, model)
                    else:
                        j = job(route, mode, model)
                    if j is not None:
                        doc["rows"].append(rep.summarize_train(j))
                        rep.compare_rows(doc["rows"])
                    save()
    save()
    print(rep.markdown(doc))
    bad = [j for j in doc["jobs"] if j["status"] != "ok"]
    return 1 if bad else 0


def _order(routes, mode):
    """Base routes first (item 3 needs native's peak); item 3 on fsdp2 only."""
    return ([r for r in routes if r in BASE_ROUTES] +
            ([r for r in routes if r in ITEM3_ROUTES] if mode == "fsdp2" else []))


def _blocked_job(a, doc, job, route, mode, model):
    peak = a.peak_gib * GiB
    if not peak:
        nat = [r for r in doc["rows"] if (r["route"], r["mode"], r["model"]) ==
               ("native", "fsdp2", model) and r["status"] == "ok"]
        peak = nat[0]["peak_MiB"] * MiB if nat and nat[0]["peak_MiB"] else 0
    if not peak:
        doc["notes"].append("%s %s: skipped, no in-memory peak (run native fsdp2 or give "
                            "--peak-gib)" % (route, model))
        return None
    plan = oversub_plan(a, peak, ob.mem_available())
    conf = plan["conf"] if route == "cma_oversub" else None
    blockers = []
    try:
        for dev in range(a.nproc):
            blockers.append(ob.Blocker(plan["blocker_free"], device=dev, tol=a.tol_mib * MiB))
        plan["left_free"] = [b.free for b in blockers]
        return job(route, mode, model, conf, {"plan": plan})
    except RuntimeError as e:
        doc["notes"].append("%s %s: no blocker: %s" % (route, model, e))
        return None
    finally:
        for b in blockers:
            b.close()


def _last_error(j):
    lines = [ln for ln in j.get("stderr_tail", "").splitlines() if ln.strip()]
    errs = [ln for ln in lines if "Error" in ln and "BrokenPipe" not in ln]
    return ((errs or lines or ["-"])[-1])[:300]


# ---------------------------------------------------------------- the workers

def build_model(torch, a, kind):
    """A decoder LM: gpt2 (LayerNorm, GELU MLP, learned positions, biases) or
    llama (RMSNorm, SwiGLU, rotary, no biases). Eager attention: the same
    kernels whatever the allocator, deterministic."""
    nn, F = torch.nn, torch.nn.functional
    llama, w, h = kind == "llama", a.width, a.heads
    ffn = a.ffn or (4 * w if not llama else 256 * math.ceil(8 * w / 3 / 256))
    norm = (lambda: nn.RMSNorm(w, eps=1e-6)) if llama else (lambda: nn.LayerNorm(w))

    def rotary(x):  # x: (B, H, T, D), the rotate-half form
        d, t = x.shape[-1], x.shape[-2]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inv)
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        x1, x2 = x.float().chunk(2, -1)
        return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = norm(), norm()
            self.qkv = nn.Linear(w, 3 * w, bias=not llama)
            self.proj = nn.Linear(w, w, bias=not llama)
            self.up = nn.Linear(w, (2 if llama else 1) * ffn, bias=not llama)
            self.down = nn.Linear(ffn, w, bias=not llama)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(b, t, 3, h, w // h).permute(2, 0, 3, 1, 4)
            if llama:
                q, k = rotary(q), rotary(k)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(w // h))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, w))
            u = self.up(self.n2(x))
            if llama:
                g, u = u.chunk(2, -1)
                u = F.silu(g) * u
            else:
                u = F.gelu(u, approximate="tanh")
            return x + self.down(u)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(a.vocab, w)
            self.pos = None if llama else nn.Embedding(a.seq, w)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.norm = norm()
            self.head = nn.Linear(w, a.vocab, bias=False)  # untied: plain for FSDP2

        def forward(self, ids, targets):
            x = self.tok(ids)
            if self.pos is not None:
                x = x + self.pos.weight[:ids.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            logits = self.head(self.norm(x)).float()
            return F.cross_entropy(logits.view(-1, a.vocab), targets.reshape(-1))

    torch.manual_seed(0)  # on the host: the same weights on every route and rank
    return LM()


def _setup(a):
    """The route's allocator before CUDA, this rank's device, the group."""
    ob.die_with_parent()  # a killed torchrun takes its workers along
    route = a.routes
    torch_routes.install({"cma_oversub": "cma", "fsdp2_cpu_offload": "native"}.get(route, route))
    import torch
    import torch.distributed as dist
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)  # a warning, not a failed run
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x = torch.ones(256, 256, device="cuda")
    (x @ x).sum().item()  # cuBLAS's context, before the sampler's baseline
    del x
    dist.init_process_group("cpu:gloo,cuda:nccl" if route == "fsdp2_cpu_offload" else "nccl")
    return torch, dist, local


def _barrier(torch, dist, one):
    torch.cuda.synchronize()
    dist.all_reduce(one)  # every rank here; cuda tensors work under either backend
    torch.cuda.synchronize()


def _emit_in_turn(torch, dist, one, out):
    """One result line per rank, ranks in turn: lines longer than a pipe's
    atomic write would otherwise interleave on torchrun's stdout."""
    for r in range(dist.get_world_size()):
        if r == dist.get_rank():
            torch_routes.emit(out)
        _barrier(torch, dist, one)


def _memory(torch, out):
    try:  # the pluggable route may raise here
        out["max_reserved_MiB"] = torch.cuda.max_memory_reserved() / MiB
        out["max_allocated_MiB"] = torch.cuda.max_memory_allocated() / MiB
    except (RuntimeError, AttributeError):
        pass
    if out["route"].startswith("cma"):
        try:
            import cma.torch as cmat
            st = cmat.memory_stats()
            out["cma"] = {k: st.get(k) for k in CMA_KEYS}
        except Exception as e:  # noqa: BLE001 - a figure less, not a failed run
            out["cma"] = {"error": str(e)[:300]}


def train_worker(a):
    torch, dist, local = _setup(a)
    rank, world, route = dist.get_rank(), dist.get_world_size(), a.routes
    one = torch.zeros(1, device="cuda")  # the barriers' all-reduce: stays 0
    sampler = torch_routes.PeakSampler(torch_routes.cuda_bus_id(torch, local), index=local)
    sampler.start()
    if a.record_trace:  # from the model's move to the device on: what the allocator saw
        torch.cuda.memory._record_memory_history(max_entries=4_000_000, stacks="python",
                                                 context=None)
    model = build_model(torch, a, a.model)
    out = {"route": route, "mode": a.mode, "model": a.model, "rank": rank, "world": world,
           "device": local, "warmup": a.warmup, "torch": torch.__version__,
           "params": sum(p.numel() for p in model.parameters()),
           "nccl": str(torch.cuda.nccl.version())}
    if a.mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model.cuda(), device_ids=[local])
    else:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        kw = {"offload_policy": CPUOffloadPolicy()} if route == "fsdp2_cpu_offload" else {}
        if not kw:
            model.cuda()  # the offload route shards on the host: its GPU could not hold it
        for blk in model.blocks:
            fully_shard(blk, **kw)
        fully_shard(model, **kw)
    host_opt = route == "fsdp2_cpu_offload"  # its parameters live on the host
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                            fused=a.adamw == "fused" and not host_opt,
                            foreach=a.adamw == "foreach" or None)
    g = torch.Generator().manual_seed(1000 + rank)
    n = a.warmup + a.steps
    data = [torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g) for _ in range(n)]
    amp = a.model == "llama"
    times, losses, local_losses = [], [], []
    for k in range(n):
        _barrier(torch, dist, one)
        t0 = time.perf_counter()
        ids = data[k].cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = model(ids[:, :-1], ids[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        _barrier(torch, dist, one)
        times.append(time.perf_counter() - t0)
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)  # SUM then / world: the same order on every route
        losses.append(float((mean / world).item()).hex())
        local_losses.append(float(loss.item()).hex())
    torch.cuda.synchronize()
    peak = sampler.stop()
    if a.record_trace:
        _write_trace(torch, os.path.join(a.record_trace, "%s_%s_%s_rank%d.csv.gz" % (
            a.mode, a.model, route, rank)), local)
    out.update(step_s=times, loss_hex=losses, local_loss_hex=local_losses, sampler=peak,
               median_step_s=statistics.median(times[a.warmup:] or times),
               peak_sampled_MiB=peak["peak"] / MiB if "peak" in peak else None)
    _memory(torch, out)
    _emit_in_turn(torch, dist, one, out)
    dist.destroy_process_group()


def _write_trace(torch, path, device):
    """This rank's allocations and completed frees since recording began, in
    bench/traces/'s replay format (cma_bench replays it on any backend)."""
    import gzip
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    actions = {"alloc": "alloc", "free_completed": "free"}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("seq,action,addr,size,stream\n")
        n = 0
        for e in snapshot["device_traces"][device]:
            if e["action"] in actions:
                f.write("%d,%s,%d,%d,%d\n" % (n, actions[e["action"]], e["addr"], e["size"],
                                             e["stream"]))
                n += 1


def coll_worker(a):
    torch, dist, local = _setup(a)
    rank, world = dist.get_rank(), dist.get_world_size()
    one = torch.zeros(1, device="cuda")
    out = {"route": a.routes, "rank": rank, "world": world, "device": local,
           "torch": torch.__version__, "nccl": str(torch.cuda.nccl.version()),
           "collectives": []}
    for op in OPS:
        for nbytes in rep.coll_sizes(a.coll_min_mib, a.coll_max_mib, a.coll_factor):
            big = torch.ones(nbytes // 4, device="cuda")  # the route's allocator makes both
            part = torch.ones(nbytes // 4 // world, device="cuda")
            call = {"all_reduce": lambda: dist.all_reduce(big),
                    "reduce_scatter": lambda: dist.reduce_scatter_tensor(part, big),
                    "all_gather": lambda: dist.all_gather_into_tensor(big, part)}[op]
            for _ in range(a.coll_warmup):
                call()
            _barrier(torch, dist, one)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(a.coll_iters):
                call()
            e1.record()
            e1.synchronize()
            t = torch.tensor([e0.elapsed_time(e1) / 1e3 / a.coll_iters], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time, as NCCL-tests
            secs = t.item()
            out["collectives"].append({"op": op, "bytes": nbytes, "s": secs,
                                       "busbw_GBps": rep.bus_bw(op, nbytes, secs, world)})
            del big, part, call
    _memory(torch, out)
    _emit_in_turn(torch, dist, one, out)
    dist.destroy_process_group()


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        a.mode, a.model = a.mode_list[0], a.model_list[0]
        (coll_worker if a.collectives else train_worker)(a)
        return 0
    return parent(a, argv)


if __name__ == "__main__":
    sys.exit(main())
