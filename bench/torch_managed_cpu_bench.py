"""RFC-0023's case studies, side by side with what users do today (issue 31).
Every variant runs in a fresh process (python3 this.py _one CASE VARIANT ...)
so that its host memory is its own; the parent prints one JSON document.

  roundtrip   CPU preprocessing and GPU compute sharing one tensor (--mib):
              per round, t.add_(1) on the CPU, then on the GPU a multiply,
              then back. pageable: t.to("cuda") / g.cpu() as written;
              pinned: preallocated pinned and device buffers, copy_
              non_blocking (the fastest copies); cma: the same code as
              pageable under cma.torch.managed_cpu() (moves); cma_map: the
              same with cma.torch.prefer_host(t) once (the GPU maps the
              pages instead of migrating them).
  checkpoint  a state dict larger than a quarter of the GPU (--gib, default
              GPU/4 + 1 GiB) loaded onto the GPU, from the page cache (each
              file read once before): torch.load(map_location="cuda"),
              torch.load(mmap=True, map_location="cuda"), safetensors
              load_file(device="cuda"), and cma: torch.load(mmap=True) under
              the switch with map_location=cma.torch.map_location("cuda")
              (each storage copied from the page cache into the host pool by
              the CPU and moved while the next is copied; cma_read: the same
              without mmap, torch.load reading into the host pool).
  loader      a DataLoader with worker processes producing image batches and
              a GPU model reading each batch: pin_memory=True +
              .to(non_blocking) (pinned) against the switch with
              cma.torch.ManagedBatches(map=False) (cma: batches migrate) and
              ManagedBatches() (cma_map: the GPU reads them where they are).
              A suffix _tN sets the threads copying a batch in the pin-memory
              thread (ManagedBatches' copy_threads; pinned_tN: the pinned
              pipeline with its copy split the same way). Each result has a
              profile: per batch, the main thread's wait and .to(), the GPU's
              time, the pin-memory thread's, and the workers'. switch: the
              first hour's code under cma.torch.managed_cpu(): the dataset's
              base image made in the parent under the switch, a DataLoader
              with default arguments (no pin_memory, default collate and
              start method: cma chooses forkserver and pins) and .to("cuda").
              pinned_fs: the pinned pipeline with workers started by
              forkserver, as the switch starts them (no cma).

Host memory: the drop of the host's MemAvailable from before the variant to
its steady state (the process's own memory, pinned and managed included),
and the process's peak resident set (VmHWM).

  python3 torch_managed_cpu_bench.py [roundtrip|checkpoint|loader|all] [--out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _kib_field(path, key):
    """A "Key:   N kB" line of a /proc file, in bytes."""
    with open(path) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def mem_available():
    return _kib_field("/proc/meminfo", "MemAvailable")


def vm_hwm():
    return _kib_field("/proc/self/status", "VmHWM")


def _cma_on():
    import cma.torch as cmat
    cmat.use_as_default()
    cmat.managed_cpu()
    return cmat


# ---------------------------------------------------------------- roundtrip

def roundtrip(variant, mib, rounds):
    import torch
    avail0 = mem_available()
    if variant.startswith("cma"):
        cmat = _cma_on()
    torch.cuda.init()
    n = mib * (1 << 20) // 4
    if variant == "pinned":
        t = torch.zeros(n).pin_memory()
        g = torch.empty(n, device="cuda")

        def one(cpu_step=True):
            nonlocal t
            if cpu_step:
                t.add_(1)
            g.copy_(t, non_blocking=True)
            g.mul_(2)
            t.copy_(g, non_blocking=True)
            torch.cuda.current_stream().synchronize()
    else:
        t = torch.zeros(n)
        if variant == "cma_map":
            cmat.prefer_host(t)  # the GPU maps the pages instead of migrating them

        def one(cpu_step=True):
            nonlocal t
            if cpu_step:
                t.add_(1)
            g = t.to("cuda")
            g.mul_(2)
            t = g.cpu()
    for _ in range(3):
        one()
    timings = {}
    for label, cpu_step in (("with_cpu_step", True), ("transfers_only", False)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(rounds):
            one(cpu_step)
        torch.cuda.synchronize()
        timings[label + "_ms"] = (time.perf_counter() - start) / rounds * 1e3
    start = time.perf_counter()
    for _ in range(rounds):
        t.add_(1)
    timings["cpu_step_alone_ms"] = (time.perf_counter() - start) / rounds * 1e3
    out = dict(timings, host_bytes=avail0 - mem_available(), vm_hwm=vm_hwm(),
               checksum=float(t[:1024].double().sum()))
    if variant.startswith("cma"):
        out["move_counts"] = cmat.move_counts()
    return out


# ---------------------------------------------------------------- checkpoint

def _state_dict(gib):
    import torch
    sizes, total, i = [], 0, 0
    while total < gib * (1 << 30):
        n = (64 << 20) if i % 3 else (256 << 20)  # bytes: a mix, like a model's
        sizes.append(n)
        total += n
        i += 1
    return {f"layer{j}.weight": torch.full((n // 2,), float(j % 7), dtype=torch.bfloat16)
            for j, n in enumerate(sizes)}


def write_checkpoint(path, fmt, gib):
    import torch
    sd = _state_dict(gib)
    if fmt == "torch":
        torch.save(sd, path)
    else:
        from safetensors.torch import save_file
        save_file(sd, path)
    del sd
    with open(path, "rb") as f:  # into the page cache for every variant alike
        while f.read(1 << 26):
            pass


def checkpoint(variant, path):
    import torch
    avail0 = mem_available()
    if variant.startswith("cma"):
        cmat = _cma_on()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    if variant == "torch_load_cuda":
        sd = torch.load(path, map_location="cuda")
    elif variant == "torch_load_mmap_cuda":
        sd = torch.load(path, map_location="cuda", mmap=True)
    elif variant == "safetensors_cuda":
        from safetensors.torch import load_file
        sd = load_file(path, device="cuda")
    elif variant == "cma":
        sd = torch.load(path, map_location=cmat.map_location("cuda"), mmap=True)
    elif variant == "cma_read":
        sd = torch.load(path, map_location=cmat.map_location("cuda"))
    else:
        raise ValueError(variant)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    out = {"seconds": seconds, "bytes": sum(v.numel() * v.element_size() for v in sd.values()),
           "on_cuda": all(v.is_cuda for v in sd.values()),
           "values_ok": all(float(v[:4].float().sum()) == 4.0 * (int(k[5:].split(".")[0]) % 7)
                            for k, v in sd.items()),
           "host_bytes_after": avail0 - mem_available(), "vm_hwm": vm_hwm()}
    if variant.startswith("cma"):
        out["host_pool"] = {k: v for k, v in __import__("cma").host_stats().items()
                            if k in ("moves", "moved_bytes_to_device", "reserved_bytes.peak")}
    return out


# ---------------------------------------------------------------- loader

_WORK = None  # shared with the workers: seconds in __getitem__, in collate, batches


def _add_work(slot, seconds):
    if _WORK is not None:
        with _WORK.get_lock():
            _WORK[slot] += seconds


class Images:
    """Image-sized float samples made on the worker's CPU (a decode and
    augmentation stand-in: a scaled copy of a base image)."""

    def __init__(self, n, side):
        self.n, self.side = n, side
        self.base = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        t0 = time.perf_counter()
        if self.base is None:
            self.base = torch.rand(3, self.side, self.side)
        out = self.base * (1.0 + (i % 13) / 13.0), i % 1000
        _add_work(0, time.perf_counter() - t0)
        return out


class _TimedCollate:
    def __init__(self, inner):
        self.inner = inner

    def __call__(self, samples):
        t0 = time.perf_counter()
        out = self.inner(samples)
        _add_work(1, time.perf_counter() - t0)
        _add_work(2, 1.0)
        return out


class _PinnedBatch:
    """The pinned pipeline with the copy into pinned memory split over
    threads, as ManagedBatches splits its copy (variant pinned_tN)."""

    def __init__(self, data, threads):
        self.data, self.threads = data, threads

    def pin_memory(self, device=None):
        import torch
        from cma.torch import cpu_switch as torch_managed

        def pin(t):
            out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            torch_managed._parallel_copy(out, t, self.threads)
            return out
        return torch_managed._map_tensors(self.data, pin)


def _threads_of(variant):
    """pinned_t4 -> ("pinned", 4); cma_map -> ("cma_map", None)."""
    base, _, t = variant.rpartition("_t")
    return (base, int(t)) if base and t.isdigit() else (variant, None)


def loader(variant, batches, batch_size, workers, side):
    global _WORK
    import multiprocessing
    import torch
    import torch.utils.data._utils.pin_memory as pin_module
    avail0 = mem_available()
    kind, threads = _threads_of(variant)
    dataset = Images(batches * batch_size + 8 * batch_size, side)
    pin = True
    if kind == "switch":
        _cma_on()
        dataset.base = torch.rand(3, side, side)  # cma memory, read by the workers
        collate = torch.utils.data.default_collate
    elif kind.startswith("cma"):
        cmat = _cma_on()
        extra = {} if threads is None else {"copy_threads": threads}
        collate = cmat.ManagedBatches(map=kind == "cma_map", **extra)
    elif threads is not None:
        collate = lambda s, n=threads: _PinnedBatch(  # noqa: E731
            torch.utils.data.default_collate(s), n)
    else:
        collate = torch.utils.data.default_collate
    _WORK = multiprocessing.Array("d", 3)
    pin_seconds = []
    real_pin = pin_module.pin_memory

    def timed_pin(data, device=None):
        t0 = time.perf_counter()
        out = real_pin(data, device)
        pin_seconds.append(time.perf_counter() - t0)
        return out
    pin_module.pin_memory = timed_pin
    torch.cuda.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 7, stride=2, padding=3), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(64, 1000)).cuda()
    # The switch's loader passes what the first hour's code passes: no
    # pin_memory, prefetch or worker choice (cma decides those it must).
    extra = {} if kind == "switch" else {"prefetch_factor": 4, "persistent_workers": False,
                                         "pin_memory": pin}
    if kind == "pinned_fs":  # the pinned pipeline with the switch's start method
        extra["multiprocessing_context"] = "forkserver"
    data = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                       collate_fn=_TimedCollate(collate), **extra)
    seen, start, peak_used = 0, None, 0
    checksum = 0.0
    waits, to_s, gpu = [], [], []
    it = iter(data)
    step = 0
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        ev0 = torch.cuda.Event(enable_timing=True)
        ev1 = torch.cuda.Event(enable_timing=True)
        ev0.record()
        x = x.to("cuda", non_blocking=True)
        y = y.to("cuda", non_blocking=True)
        t2 = time.perf_counter()
        with torch.no_grad():
            out = model(x).sum()  # every batch is read by the GPU
        ev1.record()
        if step % 16 == 0:
            checksum += float(out)
        if step == 8:
            torch.cuda.synchronize()
            start = time.perf_counter()
            pin_seconds.clear()
            with _WORK.get_lock():
                _WORK[:] = [0.0, 0.0, 0.0]
        elif step > 8:
            seen += x.shape[0]
            waits.append(t1 - t0)
            to_s.append(t2 - t1)
            gpu.append((ev0, ev1))
            peak_used = max(peak_used, avail0 - mem_available()) if step % 8 == 0 else peak_used
        step += 1
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    pin_module.pin_memory = real_pin

    def ms(values):
        return round(1e3 * sorted(values)[len(values) // 2], 3) if values else None
    made = max(_WORK[2], 1.0)
    out = {"samples_per_s": seen / seconds, "samples": seen, "host_bytes": peak_used,
           "vm_hwm": vm_hwm(), "checksum": checksum,
           # where a batch's time goes (medians per batch, ms; worker figures are means)
           "profile_ms": {
               "period": round(1e3 * seconds / max(len(waits), 1), 3),
               "main_wait": ms(waits), "main_to": ms(to_s),
               "gpu_to_and_model": ms([a.elapsed_time(b) / 1e3 for a, b in gpu]),
               "pin_thread": ms(pin_seconds),
               "worker_samples": round(1e3 * _WORK[0] / made, 3),
               "worker_collate": round(1e3 * _WORK[1] / made, 3)}}
    if kind.startswith("cma"):
        out["move_counts"] = cmat.move_counts()
        out["host_pool_reserved_peak"] = __import__("cma").host_stats()["reserved_bytes.peak"]
    return out


# ---------------------------------------------------------------- driver

def run_one(args):
    case, variant = args[0], args[1]
    rest = json.loads(args[2])
    fn = {"roundtrip": roundtrip, "checkpoint": checkpoint, "loader": loader}[case]
    print(json.dumps(fn(variant, **rest)))


def child(case, variant, **kwargs):
    env = dict(os.environ)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "_one", case, variant,
                        json.dumps(kwargs)], capture_output=True, text=True, env=env,
                       timeout=900)
    if r.returncode != 0:
        return {"error": r.stderr[-3000:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        return run_one(sys.argv[2:])
    p = argparse.ArgumentParser()
    p.add_argument("case", nargs="?", default="all")
    p.add_argument("--out")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--gib", type=float, default=None)
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--side", type=int, default=224)
    p.add_argument("--loader-rounds", type=int, default=1)
    p.add_argument("--loader-variants", default="pinned,cma,cma_map")
    a = p.parse_args()
    result = {}
    cases = ["roundtrip", "checkpoint", "loader"] if a.case == "all" else [a.case]
    if "roundtrip" in cases:
        result["roundtrip"] = {"mib": a.mib, "rounds": a.rounds}
        for v in ("pageable", "pinned", "cma", "cma_map"):
            result["roundtrip"][v] = child("roundtrip", v, mib=a.mib, rounds=a.rounds)
    if "checkpoint" in cases:
        gib = a.gib
        if gib is None:
            import torch
            gib = torch.cuda.get_device_properties(0).total_memory / (1 << 30) / 4 + 1
        result["checkpoint"] = {"gib": gib}
        for fmt, variants in (("torch", ("torch_load_cuda", "torch_load_mmap_cuda", "cma", "cma_read")),
                              ("safetensors", ("safetensors_cuda",))):
            path = os.path.join(a.dir, f"cma_ckpt.{fmt}")
            start = time.perf_counter()
            write_checkpoint(path, fmt, gib)
            result["checkpoint"][f"write_{fmt}_s"] = time.perf_counter() - start
            for v in variants:
                result["checkpoint"][v] = child("checkpoint", v, path=path)
            os.remove(path)
    if "loader" in cases:
        result["loader"] = {"batches": a.batches, "batch_size": a.batch_size,
                            "workers": a.workers, "side": a.side, "rounds": a.loader_rounds}
        variants = [v for v in a.loader_variants.split(",")]
        runs = {v: [] for v in variants}
        for _ in range(a.loader_rounds):  # interleaved, so that drift hits every variant
            for v in variants:
                runs[v].append(child("loader", v, batches=a.batches, batch_size=a.batch_size,
                                     workers=a.workers, side=a.side))
        for v in variants:
            result["loader"][v] = runs[v][0] if a.loader_rounds == 1 else {
                "rounds": runs[v],
                "median_samples_per_s": sorted(r.get("samples_per_s", 0) for r in runs[v])[
                    a.loader_rounds // 2],
                "median_host_bytes": sorted(r.get("host_bytes", 0) for r in runs[v])[
                    a.loader_rounds // 2]}
    text = json.dumps(result, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
