"""What the PyTorch allocator benchmarks share (torch_alloc_pair_bench.py,
torch_train_bench.py, torch_compile_decoder_bench.py): the routes, the
interleaved rounds, the physical-peak sampler and the summary.

Routes (each run in a fresh process, since PyTorch picks its allocator once):
  native      PyTorch's caching allocator
  expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  cma         cma.torch.use_as_default() before CUDA initialises
  cma_pool    cma.torch.pool() under torch.cuda.use_mem_pool (training only)

Rounds: round k runs every route once, the route order rotated by k, so no
route always runs first (cold file cache) or last (warm GPU clocks). A figure
is the median of its per-round values; the per-round values are kept.

Physical peak: a separate process (this file with --sampler, no torch, no
CUDA context) polls NVML (libnvidia-ml.so.1 through ctypes) every ~1 ms; the
peak is free memory when the route marks its start minus the lowest free it
saw. A separate process, so its polling takes no GIL from the measured loop.

This module imports no torch at top level: the orchestrating parent never
creates a CUDA context. Tested with fake routes in torch_routes_test.py.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import threading
import time

ROUTES = ("native", "expandable", "cma")
RESULT_PREFIX = "BENCH_RESULT "
HERE = os.path.dirname(os.path.abspath(__file__))
STARTED = time.monotonic()  # a script's --budget counts from here: its preparation included


# ---------------------------------------------------------------- routes

def base_route(route):
    """A route's allocator: "cma+mempool" is cma's, inside a torch.cuda.MemPool."""
    return route.split("+", 1)[0]


def in_mempool(route):
    """Whether the route's loop runs under torch.cuda.use_mem_pool(torch.cuda.MemPool())."""
    return route.endswith("+mempool")


def route_env(route, base=None):
    """The environment a route's process starts with."""
    route = base_route(route)
    env = dict(os.environ if base is None else base)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if route == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if route.startswith("cma"):
        env.setdefault("CMA_ALLOC_CONF", "managed_budget:16G")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def install(route):
    """In a route's process, before anything initialises CUDA."""
    if in_mempool(route) and base_route(route) in ("native", "expandable", "cma"):
        route = base_route(route)
    if route not in ("native", "expandable", "cma", "cma_pool"):
        raise SystemExit("unknown route %r" % route)
    if route == "expandable" and "expandable_segments:True" not in os.environ.get(
            "PYTORCH_CUDA_ALLOC_CONF", ""):
        raise SystemExit("route expandable needs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if route == "cma":
        import cma.torch as cmat
        cmat.use_as_default()


def emit(result):
    """A route's process hands its result to the parent (the last such line wins)."""
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()


def parse_result(stdout):
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None


def rotated(routes, k):
    s = k % len(routes)
    return list(routes[s:]) + list(routes[:s])


def run_rounds(argv_for, routes, rounds, timeout_s, budget_s=0, env_for=route_env,
               log=sys.stderr, clock=time.monotonic, started=None):
    """Runs argv_for(route, k) in a fresh process per route and round, the
    order rotated each round. A process that fails, times out or prints no
    result is recorded and the rest go on. With budget_s, a process is not
    started when the time spent plus the longest process so far would pass
    the budget, and no process may run past it (its timeout is cut); the
    budget counts from `started` (default: now).
    Returns {"order", "results": {route: [result]}, "failures": {route:
    [..]}, "skipped": [[k, route]], "wall_s"}."""
    start = clock() if started is None else started
    results = {r: [] for r in routes}
    failures = {r: [] for r in routes}
    skipped, order, longest = [], [], 0.0
    for k in range(rounds):
        for route in rotated(routes, k):
            spent = clock() - start
            if budget_s and spent + longest > budget_s:
                skipped.append([k, route])
                print("[bench] round %d %s: skipped, %.0f s of the %.0f s budget spent"
                      % (k, route, spent, budget_s), file=log)
                continue
            limit = timeout_s if not budget_s else max(1.0, min(timeout_s, budget_s - spent))
            argv = argv_for(route, k)
            t0 = clock()
            try:
                p = subprocess.run(argv, env=env_for(route), capture_output=True, text=True,
                                   timeout=limit)
                rc, out, err = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                rc = "timeout after %.0f s" % limit
                out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (
                    e.stdout or "")
                err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (
                    e.stderr or "")
            took = clock() - t0
            longest = max(longest, took)
            order.append([k, route])
            res = parse_result(out) if rc == 0 else None
            if res is None:
                fail = {"round": k, "rc": rc, "stderr_tail": err[-2500:],
                        "stdout_tail": out[-800:]}
                failures[route].append(fail)
                print("[bench] round %d %s: FAILED (rc %s) after %.1f s\n%s" % (
                    k, route, rc, took, err[-2500:]), file=log)
                continue
            res["round"] = k
            res["process_s"] = round(took, 2)
            results[route].append(res)
            print("[bench] round %d %s: done in %.1f s" % (k, route, took), file=log)
    return {"order": order, "results": results, "failures": failures, "skipped": skipped,
            "wall_s": round(clock() - start, 2)}


def remaining(budget_s, default_s):
    """Seconds left of a script's budget (counted from STARTED), at least 5;
    default_s when there is no budget."""
    if not budget_s:
        return default_s
    return max(5.0, min(default_s, budget_s - (time.monotonic() - STARTED)))


def prepare_routes(routes, timeout_s=300, log=sys.stderr):
    """Before the rounds: one untimed process per cma route installs it and
    allocates once, so whatever cma builds on first use (its extension,
    cached in TORCH_EXTENSIONS_DIR) is built outside every measured process.
    Returns {route: error} for the routes that failed (they will fail again
    in the rounds, where the failure is recorded)."""
    errors = {}
    code = ("import sys; sys.path.insert(0, %r); import torch_routes; "
            "torch_routes.install(sys.argv[1]); import torch; "
            "torch.zeros(1, device='cuda'); torch.cuda.synchronize(); print('ready')" % HERE)
    for route in routes:
        if not route.startswith("cma"):
            continue
        t0 = time.monotonic()
        try:
            p = subprocess.run([sys.executable, "-c", code, "cma"], env=route_env(route),
                               capture_output=True, text=True, timeout=timeout_s)
            if p.returncode != 0:
                errors[route] = p.stderr[-2000:]
        except subprocess.TimeoutExpired:
            errors[route] = "timed out after %d s" % timeout_s
        print("[bench] prepared %s in %.1f s%s" % (route, time.monotonic() - t0,
              ": FAILED\n" + errors[route] if route in errors else ""), file=log)
    return errors


# ---------------------------------------------------------------- summary

def summarize(run, routes, metrics, baselines=("native", "expandable")):
    """metrics: [(key, unit)] read from each result's "metrics" dict. Medians
    over rounds; ratios route / baseline of those medians. Results also carry
    "check" (must be equal across every route and round) and "problems" (a
    list of strings, each fails the run)."""
    summary = {"metrics": {}, "rounds_done": {}, "problems": []}
    res = run["results"]
    for route in routes:
        summary["rounds_done"][route] = len(res[route])
        if not res[route]:
            summary["problems"].append("route %s: no successful round" % route)
        for f in run["failures"][route]:
            summary["problems"].append("route %s round %s failed (rc %s)" % (
                route, f["round"], f["rc"]))
        for r in res[route]:
            for p in r.get("problems", []):
                summary["problems"].append("route %s round %s: %s" % (route, r["round"], p))
    for key, unit in metrics:
        m = {"unit": unit, "median": {}, "per_round": {}, "ratio": {}}
        for route in routes:
            vals = [r["metrics"][key] for r in res[route]
                    if r.get("metrics", {}).get(key) is not None]
            m["per_round"][route] = vals
            m["median"][route] = statistics.median(vals) if vals else None
        for i, base in enumerate(baselines):
            b = m["median"].get(base)
            for route in routes:
                v = m["median"][route]
                if route not in baselines[:i + 1] and b and v is not None:
                    m["ratio"]["%s/%s" % (route, base)] = v / b
        summary["metrics"][key] = m
    checks = [(route, r["round"], json.dumps(r.get("check"), sort_keys=True))
              for route in routes for r in res[route]]
    summary["check_identical"] = len({c for _, _, c in checks}) <= 1
    if not summary["check_identical"]:
        first = checks[0][2]
        summary["problems"].append("results differ across routes/rounds: " + ", ".join(
            "%s round %d" % (route, k) for route, k, c in checks if c != first))
    summary["ok"] = not summary["problems"]
    return summary


def _fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return "%.0f" % v
    if abs(v) >= 10:
        return "%.1f" % v
    return "%.3f" % v


def table(summary, routes):
    """The text table: one row per metric, each route's median, then every
    ratio route/native and route/expandable."""
    ratio_cols = []
    for m in summary["metrics"].values():
        for name in m["ratio"]:
            if name not in ratio_cols:
                ratio_cols.append(name)
    width = max([len(k) + len(m["unit"]) + 3 for k, m in summary["metrics"].items()] + [10])
    head = "%-*s" % (width, "metric") + "".join("%12s" % r for r in routes) + "".join(
        "%20s" % c for c in ratio_cols)
    lines = [head]
    for key, m in summary["metrics"].items():
        row = "%-*s" % (width, "%s [%s]" % (key, m["unit"]))
        row += "".join("%12s" % _fmt(m["median"][r]) for r in routes)
        row += "".join("%20s" % ("%.3f" % m["ratio"][c] if c in m["ratio"] else "-")
                       for c in ratio_cols)
        lines.append(row)
    lines.append("rounds done: " + ", ".join("%s %d" % kv for kv in summary["rounds_done"].items()))
    lines.append("check identical across routes and rounds: %s" % summary["check_identical"])
    for p in summary["problems"]:
        lines.append("PROBLEM: " + p)
    lines.append("verdict: %s" % ("OK" if summary["ok"] else "PROBLEMS (see above)"))
    return "\n".join(lines)


def finish(name, args, run, routes, metrics, json_path, txt_path=None, extra=None):
    """Summarizes, prints the table, writes JSON (and the table), returns the
    exit status (0 only when every route ran, checks agree and no problem)."""
    summary = summarize(run, routes, metrics)
    text = "%s: %s\n%s" % (name, " ".join(sys.argv[1:]), table(summary, routes))
    print(text)
    doc = {"bench": name, "argv": sys.argv, "args": vars(args), "routes": list(routes),
           "summary": summary, "run": run}
    if extra:
        doc.update(extra)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=1)
        if txt_path is None:
            txt_path = os.path.splitext(json_path)[0] + ".txt"
    if txt_path:
        with open(txt_path, "w") as f:
            f.write(text + "\n")
    return 0 if summary["ok"] else 1


def add_common_args(ap, rounds, timeout_s, budget_s, routes=ROUTES):
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--routes", default=",".join(routes),
                    help="comma-separated routes (native, expandable, cma%s)" % (
                        ", cma_pool" if "cma_pool" in routes else ""))
    ap.add_argument("--json", default="", help="write every figure here (and NAME.txt: the table)")
    ap.add_argument("--timeout", type=float, default=timeout_s, help="seconds per process")
    ap.add_argument("--budget", type=float, default=budget_s,
                    help="seconds for the whole script, its preparation included: no route "
                    "process starts that would pass it (skipped rounds are reported)")
    ap.add_argument("--quick", action="store_true", help="a short run to check the script works")
    ap.add_argument("--route", default="", help=argparse.SUPPRESS)  # in a route's process
    ap.add_argument("--round-index", type=int, default=0, help=argparse.SUPPRESS)


# ---------------------------------------------------------------- sampler

class _Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def _nvml_reader(bus_id, index):
    """(read_free, total, how the device was found); raises RuntimeError."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as e:
        raise RuntimeError("cannot load libnvidia-ml.so.1: %s" % e)
    rc = nvml.nvmlInit_v2()
    if rc:
        raise RuntimeError("nvmlInit_v2 returned %d" % rc)
    handle = ctypes.c_void_p()
    how = None
    if bus_id:
        if nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id.encode(), ctypes.byref(handle)) == 0:
            how = "pci " + bus_id
    if how is None:
        rc = nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle))
        if rc:
            raise RuntimeError("nvmlDeviceGetHandleByIndex_v2(%d) returned %d" % (index, rc))
        how = "index %d" % index + (" (pci %s not found)" % bus_id if bus_id else "")
    mem = _Mem()

    def read_free():
        if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem)):
            raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
        return mem.free

    read_free()
    return read_free, mem.total, how


def _fake_reader(path):
    """For the tests: free memory values from a file, one per line, the last repeated."""
    with open(path) as f:
        vals = [int(x) for x in f.read().split()]
    it = iter(vals)
    last = [vals[0]]

    def read_free():
        last[0] = next(it, last[0])
        return last[0]
    return read_free, 1 << 40, "fake " + path


def sampler_main(argv):
    """The sampler process: prints "ready", then answers "base" with "ok",
    and "stop" with one JSON line: the peak since base, then exits."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bus-id", default="")
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--fake", default="")
    a = ap.parse_args(argv)
    try:
        read_free, total, how = (_fake_reader(a.fake) if a.fake else
                                 _nvml_reader(a.bus_id, a.index))
    except (RuntimeError, OSError, ValueError) as e:
        print("error " + str(e).replace("\n", " "), flush=True)
        return 1
    state = {"base": None, "low": None, "n": 0, "gap": 0.0, "last": None, "stop": False,
             "t_base": None}
    lock = threading.Lock()
    print("ready %d %s" % (total, how), flush=True)

    def commands():
        for line in sys.stdin:
            cmd = line.strip()
            with lock:
                if cmd == "base":
                    free = read_free()
                    state.update(base=free, low=free, n=1, gap=0.0, last=time.monotonic(),
                                 t_base=time.monotonic())
                    print("ok %d" % free, flush=True)
                elif cmd == "stop":
                    state["stop"] = True
                    if state["base"] is not None:
                        state["low"] = min(state["low"], read_free())
                    return
        with lock:
            state["stop"] = True

    t = threading.Thread(target=commands, daemon=True)
    t.start()
    interval = a.interval_ms / 1e3
    while True:
        with lock:
            if state["stop"]:
                break
            if state["base"] is not None:
                free = read_free()
                now = time.monotonic()
                state["low"] = min(state["low"], free)
                state["gap"] = max(state["gap"], now - state["last"])
                state["last"] = now
                state["n"] += 1
        time.sleep(interval)
    t.join(timeout=1)
    if state["base"] is None:
        print(json.dumps({"error": "stopped before base"}), flush=True)
        return 1
    span = time.monotonic() - state["t_base"]
    print(json.dumps({"base_free": state["base"], "min_free": state["low"],
                      "peak": state["base"] - state["low"], "samples": state["n"],
                      "mean_interval_ms": 1e3 * span / max(1, state["n"]),
                      "max_gap_ms": 1e3 * state["gap"], "device": how, "total": total}),
          flush=True)
    return 0


class PeakSampler:
    """In a route's process: the sampler process for one device. start()
    after CUDA is initialised (marks the baseline), stop() -> dict with
    "peak" (bytes) or "error"."""

    def __init__(self, bus_id="", index=0, interval_ms=1.0, fake=""):
        argv = [sys.executable, os.path.abspath(__file__), "--sampler", "--bus-id", bus_id,
                "--index", str(index), "--interval-ms", str(interval_ms)]
        if fake:
            argv += ["--fake", fake]
        self.error = None
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        line = self.proc.stdout.readline().strip()
        if not line.startswith("ready"):
            self.error = line or "sampler exited (rc %s)" % self.proc.wait()
            self._close()
        else:
            self.device = line.split(" ", 2)[2]

    def start(self):
        if self.error:
            return
        self.proc.stdin.write("base\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if not line.startswith("ok"):
            self.error = "no answer to base: %r" % line

    def stop(self):
        if self.error:
            return {"error": self.error}
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            out = self.proc.stdout.readline()
            self.proc.wait(timeout=10)
            return json.loads(out)
        except (OSError, ValueError, subprocess.TimeoutExpired) as e:
            self.proc.kill()
            return {"error": "sampler: %s" % e}
        finally:
            self._close()

    def _close(self):
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc.wait()


def cuda_bus_id(torch, device=0):
    """NVML's PCI bus id string for a torch CUDA device, or "" if unknown."""
    try:
        p = torch.cuda.get_device_properties(device)
        return "%04x:%02x:%02x.0" % (p.pci_domain_id, p.pci_bus_id, p.pci_device_id)
    except (AttributeError, RuntimeError):
        return ""


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--sampler":
        sys.exit(sampler_main(sys.argv[2:]))
    sys.exit("usage: torch_routes.py --sampler [--bus-id ID] [--interval-ms MS]  (a library)")
