"""Beyond the GPU's memory (issue 30): train and serve a model larger than
the GPU's free memory, side by side with what a user picks today, in one run
on one machine. A blocker process (oversub_blocker.py) holds all of the
GPU's memory but X with plain cuMemAlloc, so every route sees the same X
free; each route runs in a fresh process started after the blocker is READY.

Training (--mode train; a transformers GPT2LMHeadModel from a config, random
init seeded on the host, dropout 0, AdamW, fp32 unless --bf16 (autocast),
fixed seeded tokens, deterministic kernels):
  inmem             native allocator, GPU free, no blocker: the ceiling; its
                    peak allocated (torch.cuda.max_memory_allocated) is P
  fsdp2_offload     FSDP2 fully_shard per block and root with CPUOffloadPolicy,
                    world size 1 (gloo + nccl); the optimizer steps on the host
  managed_plain     cma with --plain-conf (a budget past the device, no
                    oversubscription policy: the driver migrates on faults)
  cma_oversub       cma with --cma-conf (oversubscribe:1)
  cma_oversub_hint  the same plus cma.torch.host_resident(optimizer)
                    (skipped with a note when cma.torch has no such function)
  cma_oversub_direct  cma_oversub with CMA_STAGED_STEP=0 and
                    CMA_ACTIVATION_OFFLOAD=0: the allocator's placement alone,
                    without cma.torch's staged optimizer step and activation
                    offload (cma/torch/training/staged_step.py, offload.py);
                    named only
  cma_oversub_inbwd  cma_oversub plus cma.torch.step_in_backward(optimizer):
                    the optimizer's step runs during backward on a side
                    stream (after two checked plain steps), gradients kept
                    readable until opt.step(); named only
  cma_oversub_inbwd_free  the same with free_grads=True: each gradient
                    freed once applied; named only
  cma_oversub_learn  cma_oversub with learn_step:1 added to --cma-conf: the
                    allocator learns the step from the uses cma.torch's
                    global hooks report and sends live allocations away and
                    back ahead of use (allocator/learned_schedule.h); no
                    code change; named only
  cma_oversub_learn_thread  the same with learn_transfer_thread:1: the
                    bring-backs' driver calls made by a thread of their
                    own; named only
  cma_oversub_learn_core  cma_oversub_learn_thread with
                    CMA_ACTIVATION_OFFLOAD=0: the learned core alone moves
                    what does not fit (no activation offload); named only
  cma_oversub_learn_core_nothread  the same without the transfer thread;
                    named only
  cma_oversub_state_host  cma_oversub with CMA_OPTIMIZER_STATE=host: all of
                    the optimizer's state on the host whether it fits or
                    not (the default before the state was kept on the
                    device as far as it fits); named only
For each ratio R of --ratios the blocker leaves X = P / R + C free, C the
cost of a route's CUDA context, measured before inmem with cudaMemGetInfo
alone: a probe (the blocker holding nothing) reads free F with only its own
context on the GPU; a route process then initialises CUDA, cuBLAS and a
matmul as every route does and reads free f; C = F - f - what torch had
reserved then. Each route reports its own free after init ("free for
data") and R eff = P / that.
Inference (--mode infer): greedy model.generate() of a fixed prompt batch,
weights W and X = W / R + C (R = 2 by default): inmem, cma_oversub,
managed_plain, accel_auto (accelerate.infer_auto_device_map with X on the
GPU less the KV cache, the rest on 'cpu', then dispatch_model) and, when
named, accel_offload (accelerate.cpu_offload: every layer on the host).

Reported per route: s/step (median after --warmup), tokens/s, speed vs
inmem, every loss (or generated token) and whether it is bit-identical to
inmem's, the device's physical peak (free after init - lowest free after
each step, cudaMemGetInfo; and torch_routes.PeakSampler's NVML peak), host
memory used (MemAvailable at start - lowest MemAvailable while it runs,
sampled every 0.25 s by this process) and the route's ru_maxrss, bytes cma
moved per step (deltas of cma.torch.memory_stats() keys naming prefetch,
migration, eviction, host or oversubscription; every stat is kept in the
JSON), FSDP2's link traffic as an estimate. Safety: a route whose host
memory need (past the GPU, or the model built on the host) exceeds half of
MemAvailable is refused; a route is killed when MemAvailable falls below
--host-floor-gib or it passes its time; the blocker dies with this process.

What cma must provide: the CMA_ALLOC_CONF key oversubscribe:1 (until then
the cma_oversub routes fail with cma's config error, recorded as such); a
managed_budget above the device's free memory; optionally
cma.torch.host_resident(optimizer), called once right after the optimizer
is built, before its state exists (--hint-at after_first_step: after step
0); the bytes its placement moves counted in prefetched_bytes_to_device
and prefetched_bytes_to_host (the table's H2D/D2H columns).

On the GPU machine, from a folder made by bench/gpu/package.sh (OUT exists):
    export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so
    python3 torch_oversub_bench.py --quick --json OUT/oversub_quick.json
    python3 torch_oversub_bench.py --quick --mode infer --json OUT/oversub_quick_infer.json
    python3 torch_oversub_bench.py --ratios 1.5,3 --json OUT/oversub_train.json
    python3 torch_oversub_bench.py --mode infer --ratios 2 --json OUT/oversub_infer.json
each writes the JSON (every step of every route, the environment, the
plan) and the markdown table beside it (NAME.md, or --txt PATH).
"""
import argparse
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oversub_blocker as ob  # noqa: E402
import torch_routes  # noqa: E402
from oversub_report import (CMA_ROUTES, cma_conf, context_cost, host_need, markdown,  # noqa: E402
                            param_count, plan, refusal, summarize_route)

GiB, MiB = ob.GiB, ob.MiB
TRAIN_ROUTES = ("fsdp2_offload", "managed_plain", "cma_oversub", "cma_oversub_hint")
INFER_ROUTES = ("cma_oversub", "managed_plain", "accel_auto")
ALL_ROUTES = ("inmem",) + TRAIN_ROUTES + ("cma_oversub_direct", "cma_oversub_inbwd",
                                          "cma_oversub_inbwd_free", "cma_oversub_learn",
                                          "cma_oversub_learn_thread", "cma_oversub_learn_core",
                                          "cma_oversub_learn_core_nothread",
                                          "cma_oversub_state_host", "accel_auto",
                                          "accel_offload")
STAT_WORDS = ("prefetch", "migrat", "evict", "host", "oversub", "resident", "fault", "away", "discard",
              "brought", "learned")
STEP_PREFIX, INFO_PREFIX = "STEP ", "INFO "
DEFAULTS = {  # (mode, quick): sizes an H100 80GB holds for inmem, fp32
    ("train", False): dict(layers=20, width=3072, heads=24, batch=2, seq=512, steps=6, warmup=2,
                           ratios="1.5,3", route_time=900, setup_timeout=900,
                           accel_reserve_mib=1024),
    ("train", True): dict(layers=4, width=512, heads=8, batch=2, seq=128, steps=4, warmup=2,
                          ratios="1.5", route_time=120, setup_timeout=300, accel_reserve_mib=64),
    ("infer", False): dict(layers=24, width=4096, heads=32, batch=4, prompt_len=128,
                           new_tokens=32, steps=3, warmup=1, ratios="2", route_time=900,
                           setup_timeout=900, accel_reserve_mib=1024),
    ("infer", True): dict(layers=4, width=512, heads=8, batch=2, prompt_len=32, new_tokens=8,
                          steps=2, warmup=1, ratios="2", route_time=120, setup_timeout=300,
                          accel_reserve_mib=64),
}
FORWARD = ("mode", "layers", "width", "heads", "batch", "seq", "prompt_len", "new_tokens",
           "vocab", "hint_at", "accel_reserve_mib")


# ---------------------------------------------------------------- arguments

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("train", "infer"), default="train")
    ap.add_argument("--quick", action="store_true", help="a small model: checks the plumbing")
    for name in ("layers", "width", "heads", "batch", "seq", "prompt_len", "new_tokens",
                 "steps", "warmup"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--bf16", action="store_true", help="train: bf16 autocast; infer: bf16 weights")
    ap.add_argument("--fused", action="store_true",
                    help="train: AdamW(fused=True) in every route (default: foreach)")
    ap.add_argument("--ratios", default=None, help="comma-separated R: X = reference / R + context")
    ap.add_argument("--routes", default=None, help="routes besides inmem (default: by mode)")
    ap.add_argument("--cma-conf", default="oversubscribe:1,managed_budget:{budget_gib}G",
                    help="CMA_ALLOC_CONF of cma_oversub*; {budget_gib}: X + half of MemAvailable")
    ap.add_argument("--plain-conf", default="managed_budget:{budget_gib}G",
                    help="CMA_ALLOC_CONF of managed_plain")
    ap.add_argument("--plain-steps", type=int, default=4, help="managed_plain runs at most this many")
    ap.add_argument("--hint-at", choices=("init", "after_first_step"), default="init",
                    help="when cma_oversub_hint calls host_resident(optimizer)")
    ap.add_argument("--ctx-margin-mib", type=int, default=0,
                    help="added to the measured context cost (lazily loaded kernels, NCCL)")
    ap.add_argument("--ctx-fallback-mib", type=int, default=768,
                    help="context cost when the probe cannot measure it")
    ap.add_argument("--tol-mib", type=int, default=64, help="the blocker leaves X +- this")
    ap.add_argument("--accel-reserve-mib", type=int, default=None,
                    help="accel_auto: GPU memory kept off the device map besides the KV cache")
    ap.add_argument("--route-time", type=float, default=None,
                    help="seconds of steps per route; a route stops after the step that passes it")
    ap.add_argument("--setup-timeout", type=float, default=None,
                    help="seconds on top of --route-time before a route is killed as timed out")
    ap.add_argument("--host-floor-gib", type=float, default=8.0,
                    help="kill a route when MemAvailable falls below this")
    ap.add_argument("--json", default="")
    ap.add_argument("--txt", default="", help="the markdown table (default: JSON path with .md)")
    ap.add_argument("--route", default="", help=argparse.SUPPRESS)
    ap.add_argument("--time-budget", type=float, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--master-port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    for k, v in DEFAULTS[(a.mode, a.quick)].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    for k in ("seq", "prompt_len", "new_tokens"):
        if getattr(a, k) is None:
            setattr(a, k, 0)
    a.ratio_list = [float(r) for r in str(a.ratios).split(",") if r]
    a.route_list = (a.routes.split(",") if a.routes else
                    list(TRAIN_ROUTES if a.mode == "train" else INFER_ROUTES))
    bad = [r for r in a.route_list if r not in ALL_ROUTES or r == "inmem"]
    if bad or any(r <= 0 for r in a.ratio_list) or a.width % a.heads:
        ap.error("bad --routes %s, --ratios %s or --width/--heads" % (bad, a.ratios))
    return a


def positions(a):
    return a.seq if a.mode == "train" else a.prompt_len + a.new_tokens


def route_argv(a, route, ratio=0.0):
    # OVERSUB_FAKE_ROUTE: the tests' stand-in for a route's process (no torch)
    script = os.environ.get("OVERSUB_FAKE_ROUTE") or os.path.abspath(__file__)
    argv = [sys.executable, script, "--route", route]
    for k in FORWARD:
        argv += ["--" + k.replace("_", "-"), str(getattr(a, k))]
    steps = min(a.steps, a.plain_steps) if route == "managed_plain" else a.steps
    argv += ["--steps", str(steps), "--warmup", str(a.warmup), "--time-budget",
             str(a.route_time), "--ratios", str(ratio or 1), "--master-port",
             str(a.master_port)]
    return argv + (["--bf16"] if a.bf16 else []) + (["--fused"] if a.fused else [])


# ---------------------------------------------------------------- a route's process

def _cma_stats():
    import cma.torch as cmat
    return {k: v for k, v in cmat.memory_stats().items() if isinstance(v, (int, float))}


def _delta(before, after):
    return {k: v - before.get(k, 0) for k, v in after.items()
            if any(w in k for w in STAT_WORDS) and v != before.get(k, 0)}


def route_main(a):
    ob.die_with_parent()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    route = a.route
    if route in CMA_ROUTES:
        import cma.torch as cmat
        if route == "cma_oversub_hint" and not hasattr(cmat, "host_resident"):
            torch_routes.emit({"route": route, "status": "skipped",
                               "reason": "cma.torch has no host_resident()"})
            return
        cmat.use_as_default()
    import torch
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.set_device(0)
    x = torch.ones(256, 256, device="cuda")
    (x @ x).sum().item()
    del x
    torch.cuda.synchronize()
    free0, total = torch.cuda.mem_get_info()
    out = {"route": route, "free_after_init": free0, "total": total,
           "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
           "cma_conf": os.environ.get("CMA_ALLOC_CONF") if route in CMA_ROUTES else None}
    try:
        out["reserved_after_init"] = torch.cuda.memory_reserved()
    except (RuntimeError, AttributeError):
        pass
    _line(INFO_PREFIX, out)
    if route == "ctx":
        torch_routes.emit(out)
        return
    import transformers
    out["transformers"] = transformers.__version__
    try:
        import accelerate
        out["accelerate"] = accelerate.__version__
    except ImportError:
        out["accelerate"] = None
    sampler = torch_routes.PeakSampler(torch_routes.cuda_bus_id(torch))
    sampler.start()
    model = build_model(torch, a)
    out["param_count"] = sum(p.numel() for p in model.parameters())
    out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    body = train_route if a.mode == "train" else infer_route
    steps = body(torch, a, model, out)
    torch.cuda.synchronize()
    out["sampler"] = sampler.stop()
    out["steps"] = steps
    try:
        out.setdefault("max_allocated", torch.cuda.max_memory_allocated())
        out["max_reserved"] = torch.cuda.max_memory_reserved()
    except (RuntimeError, AttributeError):
        pass
    out["ru_maxrss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["status"] = out.get("status", "ok")
    if route in CMA_ROUTES:
        out["cma_stats"] = _cma_stats()
    torch_routes.emit(out)


def _line(prefix, rec):
    sys.stdout.write(prefix + json.dumps(rec) + "\n")
    sys.stdout.flush()


def build_model(torch, a):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=a.vocab, n_positions=positions(a), n_embd=a.width,
                     n_layer=a.layers, n_head=a.heads, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, use_cache=a.mode == "infer", attn_implementation="eager")
    torch.manual_seed(0)  # on the host: the same weights whatever the route places where
    model = GPT2LMHeadModel(cfg)
    if a.mode == "infer":
        model.eval()
        if a.bf16:
            model.to(torch.bfloat16)
    return model


class _StepLog:
    """Per step: time, lowest free, cma's moves; a STEP line the parent can
    read even if the route is killed later; stops at the time budget."""

    def __init__(self, torch, a, out):
        self.torch, self.a, self.out, self.steps, self.spent = torch, a, out, [], 0.0
        self.cma = a.route in CMA_ROUTES
        self.prev = _cma_stats() if self.cma else None

    def record(self, rec):
        torch = self.torch
        torch.cuda.synchronize()
        rec["free_low"] = torch.cuda.mem_get_info()[0]
        if self.cma:
            now = _cma_stats()
            rec["cma_delta"] = _delta(self.prev, now)
            self.prev = now
        self.steps.append(rec)
        _line(STEP_PREFIX, rec)
        self.spent += rec["s"]
        if len(self.steps) < self.a.steps and self.spent + rec["s"] > self.a.time_budget:
            self.out["status"] = "truncated at %.0f s" % self.spent
            return False
        return True


def train_route(torch, a, model, out):
    route = a.route
    if route == "fsdp2_offload":
        import torch.distributed as dist
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(a.master_port or 29517)
        dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
        blocks = sum(p.numel() * p.element_size() for b in model.transformer.h
                     for p in b.parameters())
        # Blocks reshard after forward, so their params cross in forward and
        # backward; the root's once; every gradient comes back.
        out["est_h2d_bytes_per_step"] = 2 * blocks + (out["param_bytes"] - blocks)
        out["est_d2h_bytes_per_step"] = out["param_bytes"]
        for b in model.transformer.h:
            fully_shard(b, offload_policy=CPUOffloadPolicy())
        fully_shard(model, offload_policy=CPUOffloadPolicy())
    else:
        model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if a.fused else None)
    hint = None
    if route == "cma_oversub_hint":
        import cma.torch as cmat
        hint = cmat.host_resident
        if a.hint_at == "init":
            out["hint_result"] = repr(hint(opt))[:200]
    if route in ("cma_oversub_inbwd", "cma_oversub_inbwd_free"):
        import cma.torch as cmat
        # _free: gradients freed once applied (the hint's free_grads=True; its
        # default keeps them readable until the step).
        cmat.step_in_backward(opt, bucket_mib=int(os.environ.get("OVERSUB_INBWD_BUCKET", "64")),
                              free_grads=route == "cma_oversub_inbwd_free")
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, a.vocab, (a.batch, a.seq), generator=g) for _ in range(a.steps)]
    log = _StepLog(torch, a, out)
    for k in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        # GPU time of forward + backward and of the optimizer's step apart
        # (events on the current stream: no sync between them).
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        marks[0].record()
        ids = data[k].cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        cpu0 = time.perf_counter()
        loss.backward()
        bwd_cpu = time.perf_counter() - cpu0
        marks[1].record()
        opt.step()
        marks[2].record()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if hint is not None and a.hint_at == "after_first_step" and k == 0:
            out["hint_result"] = repr(hint(opt))[:200]
        split = {"fwd_bwd_s": marks[0].elapsed_time(marks[1]) / 1e3,
                 "opt_s": marks[1].elapsed_time(marks[2]) / 1e3}
        split["bwd_cpu_s"] = bwd_cpu  # the host's time in loss.backward() (no sync)
        if not log.record({"step": k, "s": dt, "loss": loss.item(), **split}):
            break
    if route == "fsdp2_offload":
        torch.distributed.destroy_process_group()
    if route in CMA_ROUTES:
        from cma.torch.training import staged_step as torch_staged_step
        out["steps_staged"] = torch_staged_step.steps_staged(opt)
        out["unstaged_because"] = torch_staged_step.unstaged_because(opt)
        from cma.torch.training import offload as torch_offload
        out["activation_offload"] = torch_offload.stats(torch.cuda.current_device())
        from cma.torch.training import step_in_backward as torch_step_in_backward
        out["buckets_in_backward"] = torch_step_in_backward.buckets_applied(opt)
        out["tail_state_bytes"] = torch_step_in_backward.tail_state_bytes(opt)
    return log.steps


def infer_route(torch, a, model, out):
    from transformers import StoppingCriteria, StoppingCriteriaList
    route = a.route
    if route == "accel_auto":
        from accelerate import dispatch_model, infer_auto_device_map
        elt = 2 if a.bf16 else 4
        kv = 2 * a.layers * a.batch * positions(a) * a.width * elt
        room = max(0, torch.cuda.mem_get_info()[0] - kv - a.accel_reserve_mib * MiB)
        dm = infer_auto_device_map(model, max_memory={0: room, "cpu": ob.mem_available() // 2},
                                   no_split_module_classes=["GPT2Block"])
        out["device_map"] = {str(v): sum(1 for x in dm.values() if x == v) for v in set(dm.values())}
        out["gpu_room_for_weights"] = room
        # main_device: offloaded layers run on the GPU even when none is placed there
        model = dispatch_model(model, device_map=dm, main_device=0)
    elif route == "accel_offload":
        from accelerate import cpu_offload
        cpu_offload(model, execution_device=torch.device("cuda", 0))
    else:
        model.cuda()

    class Cap(StoppingCriteria):
        def __init__(self, limit):
            self.limit, self.t0 = limit, time.perf_counter()

        def __call__(self, input_ids, scores, **kw):
            stop = time.perf_counter() - self.t0 > self.limit
            return torch.full((input_ids.shape[0],), stop, dtype=torch.bool,
                              device=input_ids.device)

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.prompt_len), generator=g).cuda()
    mask = torch.ones_like(ids)
    log = _StepLog(torch, a, out)
    for k in range(a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        cap = Cap(max(1.0, a.time_budget - log.spent))
        with torch.no_grad():
            gen = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                                 pad_token_id=0, stopping_criteria=StoppingCriteriaList([cap]))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        new = gen[:, a.prompt_len:].tolist()
        if not log.record({"step": k, "s": dt, "new_tokens": len(new[0]), "tokens": new}):
            break
        if len(new[0]) < a.new_tokens:
            out["status"] = "truncated: generation stopped at %d tokens" % len(new[0])
            break
    return log.steps


# ---------------------------------------------------------------- the parent

def run_route(argv, env, timeout, floor, log=None, poll=0.25):
    """One route in its own process group: its stdout/stderr go to files
    (no pipe to fill), MemAvailable is sampled while it runs, and it is
    killed past `timeout` or when MemAvailable falls below `floor`. Partial
    STEP lines survive a kill."""
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        avail0 = low = ob.mem_available()
        t0 = time.monotonic()
        p = subprocess.Popen(argv, env=env, stdout=fo, stderr=fe, start_new_session=True)
        killed = None
        try:
            while p.poll() is None:
                time.sleep(poll)
                av = ob.mem_available()
                low = min(low, av)
                if av < floor:
                    killed = "killed: MemAvailable %.1f GiB < floor" % (av / GiB)
                elif time.monotonic() - t0 > timeout:
                    killed = "timed out after %.0f s" % timeout
                if killed:
                    os.killpg(p.pid, signal.SIGKILL)
                    break
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        fo.seek(0)
        fe.seek(0)
        stdout, stderr = fo.read(), fe.read()
    res = torch_routes.parse_result(stdout)
    lines = stdout.splitlines()
    steps = [json.loads(ln[len(STEP_PREFIX):]) for ln in lines if ln.startswith(STEP_PREFIX)]
    rec = res if res is not None else {"steps": steps}
    rec.setdefault("steps", steps)
    if res is None:
        for ln in lines:  # what the route knew before it was stopped
            if ln.startswith(INFO_PREFIX):
                rec.update(json.loads(ln[len(INFO_PREFIX):]))
        rec["status"] = killed or "failed (rc %s)" % p.returncode
        rec["stderr_tail"] = stderr[-3000:]
    rec.setdefault("status", "ok")
    rec["rc"] = p.returncode
    rec["wall_s"] = round(time.monotonic() - t0, 2)
    rec["host_avail_at_start"] = avail0
    rec["host_used_peak"] = avail0 - low
    print("[oversub] %s: %s in %.1f s" % (argv[argv.index("--route") + 1], rec["status"],
                                          rec["wall_s"]), file=log or sys.stderr)
    return rec


def route_env(route, conf=None):
    env = dict(os.environ, PYTHONUNBUFFERED="1", CUBLAS_WORKSPACE_CONFIG=":4096:8")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("CMA_ALLOC_CONF", None)
    env.pop("CMA_STAGED_STEP", None)
    env.pop("CMA_ACTIVATION_OFFLOAD", None)
    env.pop("CMA_OPTIMIZER_STATE", None)
    if route == "cma_oversub_direct":
        env["CMA_STAGED_STEP"] = env["CMA_ACTIVATION_OFFLOAD"] = "0"
    if route.startswith("cma_oversub_learn_core"):
        env["CMA_ACTIVATION_OFFLOAD"] = "0"
    if route == "cma_oversub_state_host":
        env["CMA_OPTIMIZER_STATE"] = "host"
    if conf:
        env["CMA_ALLOC_CONF"] = conf
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through every finally: the blocker and route die


def main(argv=None):
    a = parse_args(argv)
    if a.route:
        route_main(a)
        return 0
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)
    a.master_port = free_port()
    mi = ob.meminfo()
    gpu = ob.gpu_facts()
    doc = {"bench": "torch_oversub_bench",
           "argv": sys.argv[:1] + (sys.argv[1:] if argv is None else list(argv)), "args": {
        k: v for k, v in vars(a).items()}, "sections": [], "records": [],
        "env": {"gpu": gpu, "mem_available": mi.get("MemAvailable"), "mem_total": mi.get("MemTotal"),
                "cpus": os.cpu_count(), "kernel": " ".join(os.uname()), "python": sys.version}}
    json_path, txt_path = a.json, a.txt or (os.path.splitext(a.json)[0] + ".md" if a.json else "")

    def save():
        if json_path:
            with open(json_path, "w") as f:
                json.dump(doc, f, indent=1)
        if txt_path:
            with open(txt_path, "w") as f:
                f.write(markdown(doc))

    tokens = a.batch * (a.seq if a.mode == "train" else 1)
    w_est = param_count(a.layers, a.width, a.vocab, positions(a)) * (2 if a.bf16 and a.mode == "infer"
                                                                      else 4)
    why = refusal(w_est, mi.get("MemAvailable", 0))
    if why:
        print("inmem " + why + " (the model is built on the host)", file=sys.stderr)
        return 2
    timeout = a.route_time + a.setup_timeout
    floor = a.host_floor_gib * GiB
    if any(r in CMA_ROUTES for r in a.route_list) and not os.environ.get("OVERSUB_FAKE_ROUTE"):
        # cma's extension is compiled on first use: not inside a route's time
        torch_routes.prepare_routes(["cma"], a.setup_timeout)
    probe_free, calib = 0, {}
    try:  # the context's cost, before inmem, so that inmem runs on a GPU of its own
        with ob.Blocker(-1) as probe:
            probe_free = probe.free
            calib = run_route(route_argv(a, "ctx"), route_env("ctx"), a.setup_timeout, floor)
    except RuntimeError as e:
        calib = {"error": str(e)}
    doc["context_calibration"] = {"probe_free": probe_free, **calib}
    ctx, doc["context_how"] = context_cost(probe_free, calib, a.ctx_margin_mib * MiB,
                                           a.ctx_fallback_mib * MiB)
    doc["context_bytes"] = ctx
    save()
    base = run_route(route_argv(a, "inmem"), route_env("inmem"), timeout, floor)
    base["route"] = "inmem"
    doc["records"].append({"ratio": None, **base})
    base_row = summarize_route(base, None, a.mode, a.warmup, tokens)
    doc["sections"].append({"plan": {}, "rows": [base_row]})
    for k in ("torch", "transformers", "accelerate"):
        doc["env"][k] = base.get(k)
    save()
    if "max_allocated" not in base or "param_bytes" not in base:
        doc["sections"][0]["notes"] = ["inmem failed: no plan. " + base.get("stderr_tail", "")[-800:]]
        save()
        print(markdown(doc))
        return 1
    rc = 0
    for ratio in a.ratio_list:
        p = plan(a.mode, base, ratio, ctx)
        sec = {"plan": p, "rows": [], "notes": []}
        doc["sections"].append(sec)
        avail = ob.mem_available()
        try:
            blocker = ob.Blocker(p["blocker_free"], tol=a.tol_mib * MiB)
        except RuntimeError as e:
            sec["notes"].append("no blocker: %s" % e)
            rc = 1
            continue
        try:
            sec["blocker"] = "left %.2f GiB free of %.1f GiB (held %.2f GiB)" % (
                blocker.free / GiB, blocker.facts["total"] / GiB, blocker.facts["held"] / GiB)
            for route in a.route_list:
                need = host_need(route, a.mode, base, p["data_free"])
                why = refusal(need, ob.mem_available())
                conf = None
                if route in CMA_ROUTES:
                    conf = cma_conf(a.plain_conf if route == "managed_plain" else a.cma_conf,
                                    p["data_free"], avail)
                    if route.startswith("cma_oversub_learn"):
                        conf += ",learn_step:1"
                    if route in ("cma_oversub_learn_thread", "cma_oversub_learn_core"):
                        conf += ",learn_transfer_thread:1"
                if why or not blocker.alive():
                    rec = {"route": route, "status": why or "blocker died", "steps": []}
                    print("[oversub] R=%g %s: %s" % (ratio, route, rec["status"]), file=sys.stderr)
                else:
                    rec = run_route(route_argv(a, route, ratio), route_env(route, conf),
                                    timeout, floor)
                rec.update(route=route, host_need=need, conf=conf)
                doc["records"].append({"ratio": ratio, **rec})
                sec["rows"].append(summarize_route(rec, base_row, a.mode, a.warmup, tokens))
                if rec.get("reason"):
                    sec["notes"].append("%s: %s" % (route, rec["reason"]))
                if str(rec.get("status", "")).startswith(("failed", "killed", "timed")):
                    rc = 1
                    # The route's own error, not the NVML sampler's broken pipe after it.
                    tail = [ln for ln in rec.get("stderr_tail", "").splitlines()
                            if ln.strip() and "Error" in ln and "BrokenPipe" not in ln] or \
                        [ln for ln in rec.get("stderr_tail", "").splitlines() if ln.strip()]
                    sec["notes"].append("%s %s%s" % (route, rec["status"],
                                                     ": " + tail[-1][:300] if tail else ""))
                save()
        finally:
            blocker.close()
    save()
    print(markdown(doc))
    return rc


if __name__ == "__main__":
    sys.exit(main())
