#!/usr/bin/env python3
"""PyTorch's own test/test_cuda.py as a conformance suite for cma (issue 20,
item 5): its allocator-facing tests (names containing graph, memory,
snapshot, out_of_memory, caching_allocator, mempool or mem_pool) run under
PyTorch's native allocator, under cma, and optionally under expandable
segments, each route in fresh processes, and a comparison lists what native
passes and cma does not.

  run_conformance.py --out DIR [--routes native,cma,expandable]
                     [--orders whole,chunks,each] [--chunk 20] [--jobs 1]
                     [--test-file upstream/test_cuda.py] [--total-s 560]
                     [--route-s 200] [--soft-s 40] [--hard-s 60]
                     [--exclude SUBSTRING]... [--only SUBSTRING]...

Orders (issue 32): a result that depends on what ran before it in the same
process is not conformance, so each order runs apart: whole (one process,
as PyTorch's CI runs the file), chunks (fresh processes of --chunk tests in
collection order) and each (every test alone); orders.md puts them side by
side when more than one ran. --jobs N runs chunks and each in up to N
processes at once, then every test that did not pass again alone
(parallel.py).

Per route and order it writes DIR/<route>.json (whole) or
DIR/<route>_<chunksN|each>.json (every test's outcome and one-line reason,
torch/device facts, stand-ins used); then DIR/compare.md (the comparison;
compare_<order>.md for the others) and DIR/logs.tar.gz (pytest's output per route, the event logs,
and <route>_outcomes.txt, the lists to commit; compare.py --lists rebuilds
them from the JSON files; they are written to a temporary folder first).
Five files at most: the GPU machine returns eight.

Robustness, so that one run on the GPU machine is enough:
- the route is installed by a pytest plugin before CUDA initialises;
- a test that kills the process (a segfault, an abort, CUDA's sticky
  errors) is recorded as "crashed" with the last telling line of the log,
  and a new process resumes after it;
- after a test that did not pass, the plugin checks that CUDA still works
  (torch.cuda.synchronize()); a sticky error or an unfinished capture ends
  the process and the next test runs in a fresh one (context_restarts);
- a test is stopped after --soft-s (SIGALRM, recorded as "timeout"); one
  stuck in C is ended by faulthandler or, failing that, killed by this driver
  after --hard-s, and the run resumes after it;
- each route has a time budget (--route-s, and --total-s shared by all
  routes); tests left when it runs out are "not_run".
Exit status: 0 when every route ran (whatever its tests did), 2 when a route
could not run meaningfully (route install failed, the file did not import).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# parallel.py imports this module by name: run as a script, it is that module.
sys.modules.setdefault("run_conformance", sys.modules[__name__])
import compare  # noqa: E402
import conformance_core as core  # noqa: E402

ROUTES = ("native", "cma", "expandable")
DEFAULT_TEST_FILE = os.path.join(HERE, "upstream", "test_cuda.py")
# Tests that compile C++/CUDA or Triton code on first use get more time
# (the builds are cached in TORCH_EXTENSIONS_DIR, shared by the routes).
SLOW_TESTS = {
    "test_mempool_empty_cache_inactive": 150, "test_mempool_with_allocator": 150,
    "test_tensor_delete_after_allocator_delete": 150,
    "test_mempool_limited_memory_with_allocator": 150,
    "test_deleted_mempool_not_used_on_oom": 150, "test_mempool_expandable": 150,
    "test_cpp_memory_snapshot_pickle": 150, "test_memory_compile_regions": 150,
    "test_fx_memory_profiler_augmentation": 120, "test_graph_optims": 90,
    "test_allocator_fuzz": 90,
}
KILL_GRACE_S = 10.0
STARTUP_LIMIT_S = 240.0   # importing torch and collecting test_cuda.py
MAX_RESTARTS = 25


def pytest_command(test_file):
    return [sys.executable, "-m", "pytest", test_file, "-p", "conformance_plugin",
            "-p", "no:cacheprovider", "--noconftest", "-c", os.devnull, "--capture=sys", "-q",
            "--tb=short", "--color=no", "-rN", "--rootdir", os.path.dirname(test_file)]


def route_env(route, base=None):
    env = dict(os.environ if base is None else base)
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CI"):
        env.pop(var, None)
    if route == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    env.setdefault("TORCH_EXTENSIONS_DIR", "/tmp/torch_extensions_conformance")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def describe_exit(code):
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


TELLING = ("Error", "error:", "Fatal", "Segmentation", "Aborted", "terminate", "what()",
           "CUDA", "Timeout (", "core dumped", "Killed")


def telling_line(log_text):
    """The line of a dying process's output most likely to say why."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()][-40:]
    for ln in reversed(lines):
        if any(t in ln for t in TELLING) and not ln.startswith("File "):
            return core.one_line(ln)
    return core.one_line(lines[-1]) if lines else "no output"


def _kill(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def child_env(route, events_path, test_file, deadline, soft_s, hard_s, slow, exclude, chunk,
              only, only_path=None):
    """The environment of one pytest child (conformance_plugin.py reads it)."""
    env = route_env(route)
    env.update(CMA_CONF_ROUTE=route, CMA_CONF_EVENTS=events_path,
               CMA_CONF_TEST_FILE=test_file, CMA_CONF_DEADLINE=str(deadline),
               CMA_CONF_SOFT_TIMEOUT=str(soft_s), CMA_CONF_HARD_TIMEOUT=str(hard_s),
               CMA_CONF_SLOW=json.dumps(slow if slow is not None else SLOW_TESTS),
               CMA_CONF_EXCLUDE=json.dumps(list(exclude)), CMA_CONF_CHUNK=str(chunk),
               CMA_CONF_INCLUDE=json.dumps(list(only)))
    if only_path:
        env["CMA_CONF_ONLY"] = only_path
    return env


def run_child(command, test_file, env, log_path, header, deadline, slow, soft_s, hard_s,
              poll_s, kill_grace_s, on_poll=None):
    """Starts one child and watches it to its end: killed when the budget is
    gone, when a test overruns its hard limit, or when nothing happens
    outside a test for STARTUP_LIMIT_S. on_poll(events) sees the event log at
    every poll (the parallel driver learns the selection from it). Returns
    (exit code, (outcome, reason) when the driver killed it, the child's part
    of the log, its events)."""
    events_path = env["CMA_CONF_EVENTS"]
    with open(log_path, "a") as log:
        log.write(f"\n===== {header}: {' '.join(command)}\n")
        log.flush()
        log_offset = log.tell()
        proc = subprocess.Popen(command, cwd=os.path.dirname(test_file) or ".", env=env,
                                stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    killed = None
    last_count, last_progress = 0, time.time()
    while proc.poll() is None:
        time.sleep(poll_s)
        events = core.read_events(events_path)
        if on_poll:
            on_poll(events)
        now = time.time()
        if len(events) != last_count:
            last_count, last_progress = len(events), now
        flight = core.in_flight(events)
        if now > deadline + kill_grace_s:
            killed = ("not_run", core.BUDGET_MARK + " (the driver stopped the process)")
        elif flight and now - flight[1] > _limit(flight[0], slow, soft_s, hard_s) + kill_grace_s:
            killed = ("timeout", f"{core.TIMEOUT_MARK}: no result after "
                      f"{now - flight[1]:.0f} s; the driver killed the process")
        elif not flight and now - last_progress > STARTUP_LIMIT_S:
            killed = ("crashed", f"no progress for {STARTUP_LIMIT_S:.0f} s outside any test")
        if killed:
            _kill(proc)
    with open(log_path, errors="replace") as log:
        log.seek(log_offset)
        attempt_log = log.read()
    events = core.read_events(events_path)
    if on_poll:
        on_poll(events)
    return proc.returncode, killed, attempt_log, events


def fold_child(result, events, attempt_log, code, killed, soft_s):
    """Folds one child's events into the route's result: its meta and
    selection (the first child's), every finished test, and the test it died
    in (crashed, timeout or the driver's verdict). Returns (the test in
    flight when it ended or None, whether any test ended, how many CUDA
    context restarts it reported)."""
    tests = result["tests"]
    context_restarts = 0
    progress = any(ev.get("ev") == "end" for ev in events)
    for ev in events:
        kind = ev.get("ev")
        if kind == "meta" and not result["meta"]:
            result["meta"] = {k: v for k, v in ev.items() if k != "ev"}
        elif kind == "selected" and result["order"] is None:
            take_selection(result, ev)
        elif kind == "end":
            tests[ev["id"]] = {"outcome": ev["outcome"], "reason": ev.get("reason", ""),
                               "dur": ev.get("dur")}
        elif kind == "fatal":
            result["fatal"] = ev["msg"]
        elif kind == "restart":
            result["context_restarts"].append({"after": ev["after"], "reason": ev["reason"]})
            context_restarts += 1
    flight = core.in_flight(events)
    if flight:
        nodeid, t0 = flight
        if killed:
            outcome, reason = killed
        elif ("Timeout (" in attempt_log or core.TIMEOUT_MARK in attempt_log) \
                and time.time() - t0 >= soft_s:
            outcome, reason = "timeout", (f"{core.TIMEOUT_MARK}: stuck past the hard limit; "
                                          "faulthandler ended the process")
        else:
            outcome = "crashed"
            reason = f"process {describe_exit(code)}: {telling_line(attempt_log)}"
        tests[nodeid] = {"outcome": outcome, "reason": core.one_line(reason),
                         "dur": round(time.time() - t0, 3)}
    return flight, progress, context_restarts


def take_selection(result, ev):
    """The route's order is the first child's selection (later children
    report only the ids they were given)."""
    result["order"] = ev["ids"]
    result["collected"] = ev.get("collected")
    for nodeid in ev.get("excluded", []):
        result["tests"][nodeid] = {"outcome": "not_run", "reason": core.EXCLUDED_MARK,
                                   "dur": None}


def new_result(route, test_file, budget_s, soft_s, hard_s, command, exclude, chunk):
    return {"route": route, "test_file": test_file, "budget_s": budget_s,
            "soft_timeout_s": soft_s, "hard_timeout_s": hard_s, "command": command,
            "meta": {}, "order": None, "tests": {}, "restarts": 0, "fatal": None,
            "collected": None, "context_restarts": [], "exclude": list(exclude),
            "run_order": core.order_name(chunk), "chunk": chunk, "processes": 0}


def finish_result(result, started, out_dir, work, stem):
    """Summary and wall time; writes <stem>.json and the outcome list."""
    order = result["order"] or []
    result["summary"] = core.summarize(order, result["tests"])
    result["selected"] = len(order)
    result["wall_s"] = round(time.time() - started, 1)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    with open(os.path.join(work, f"{stem}_outcomes.txt"), "w") as f:
        f.write(compare.outcome_list(result))
    return result


def route_stem(route, chunk):
    order_name = core.order_name(chunk)
    return route if order_name == "whole" else f"{route}_{order_name}"


def run_route(route, test_file, out_dir, budget_s, soft_s, hard_s, command=None,
              slow=None, max_restarts=MAX_RESTARTS, poll_s=0.5, kill_grace_s=KILL_GRACE_S,
              exclude=(), work_dir=None, chunk=0, only=()):
    """Runs one route to completion across as many processes as crashes
    need, and with `chunk` > 0 a fresh process every `chunk` tests in
    collection order. Returns the route's result dict (also written to
    <route>.json, or <route>_<order>.json for a chunked order)."""
    started = time.time()
    deadline = started + budget_s
    command = command or pytest_command(test_file)
    work = work_dir or os.path.join(out_dir, "work")
    os.makedirs(work, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    stem = route_stem(route, chunk)
    log_path = os.path.join(work, f"{stem}.log")
    open(log_path, "w").close()
    result = new_result(route, test_file, budget_s, soft_s, hard_s, command, exclude, chunk)
    tests = result["tests"]
    only_path = None
    attempt = 0
    while True:
        events_path = os.path.join(work, f"{stem}.events.{attempt}.jsonl")
        if os.path.exists(events_path):
            os.remove(events_path)
        env = child_env(route, events_path, test_file, deadline, soft_s, hard_s, slow, exclude,
                        chunk, only, only_path)
        code, killed, attempt_log, events = run_child(
            command, test_file, env, log_path, f"{stem} attempt {attempt}", deadline, slow,
            soft_s, hard_s, poll_s, kill_grace_s)
        result["processes"] += 1
        flight, progress, context_restarts = fold_child(result, events, attempt_log, code,
                                                        killed, soft_s)
        if result["fatal"]:
            break
        if not result["order"]:
            result["fatal"] = (f"no test was selected (collection {describe_exit(code)}): "
                               f"{telling_line(attempt_log)}")
            break
        remaining = [i for i in result["order"] if i not in tests]
        if not remaining:
            break
        why = None
        if time.time() > deadline:
            why = core.BUDGET_MARK
        elif not flight and not progress:
            # Nothing ran in this process: restarting would loop.
            why = f"not run: the process ended ({describe_exit(code)}) without running a test"
        elif result["restarts"] >= max_restarts:
            why = f"not run: {max_restarts} restarts used"
        if why:
            for nodeid in remaining:
                tests[nodeid] = {"outcome": "not_run", "reason": why, "dur": None}
            break
        # A process that ran its chunk to the end is the plan, not a restart.
        planned = chunk and not flight and not killed and not context_restarts
        attempt += 1
        if not planned:
            result["restarts"] += 1
        only_path = os.path.join(work, f"{stem}.only.{attempt}.json")
        with open(only_path, "w") as f:
            json.dump(remaining, f)
    return finish_result(result, started, out_dir, work, stem)


def _limit(nodeid, slow, soft_s, hard_s):
    for part, seconds in (slow if slow is not None else SLOW_TESTS).items():
        if part in nodeid:
            return float(seconds) + max(hard_s - soft_s, 10.0)
    return hard_s


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the results")
    ap.add_argument("--routes", default="native,cma",
                    help="comma-separated, from native, cma, expandable (the first is "
                         "the baseline of the comparison)")
    ap.add_argument("--test-file", default=DEFAULT_TEST_FILE)
    ap.add_argument("--total-s", type=float, default=560.0,
                    help="time for all routes together (one 10-minute command)")
    ap.add_argument("--route-s", type=float, default=230.0, help="most time one route gets")
    ap.add_argument("--soft-s", type=float, default=40.0, help="per-test limit (SIGALRM)")
    ap.add_argument("--hard-s", type=float, default=60.0,
                    help="per-test limit for a test stuck in C (process ended, run resumed)")
    ap.add_argument("--orders", default="whole",
                    help="comma-separated run orders: whole (the selection in one process, "
                         "as PyTorch's CI runs the file), chunks (fresh processes of --chunk "
                         "tests in collection order), each (every test in a fresh process)")
    ap.add_argument("--chunk", type=int, default=20, help="tests per process for 'chunks'")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes at once for chunks and each (whole is one process); "
                         "with more than 1, every test that failed, errored, timed out or "
                         "crashed then runs again alone and that outcome counts")
    ap.add_argument("--exclude", action="append", default=[], metavar="SUBSTRING",
                    help="do not run selected tests whose id contains SUBSTRING "
                         "(recorded as not_run); repeatable")
    ap.add_argument("--all-tests", action="store_true",
                    help="select every test of the file, not only the allocator-facing "
                         "ones (conformance_core.KEYWORDS)")
    ap.add_argument("--only", action="append", default=[], metavar="SUBSTRING",
                    help="select only tests whose id contains SUBSTRING (the others are "
                         "not selected at all); repeatable")
    args = ap.parse_args(argv)
    routes = [r.strip() for r in args.routes.split(",") if r.strip()]
    bad = [r for r in routes if r not in ROUTES]
    if bad or not routes:
        ap.error(f"unknown route(s) {bad}; choose from {', '.join(ROUTES)}")
    if len(set(routes)) != len(routes):
        ap.error("a route is named twice")
    if args.hard_s <= args.soft_s:
        ap.error("--hard-s must exceed --soft-s")
    chunks = {"whole": 0, "chunks": args.chunk, "each": 1}
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    if not orders or any(o not in chunks for o in orders) or len(set(orders)) != len(orders):
        ap.error(f"--orders takes whole, chunks and each, each at most once, not {args.orders}")
    if args.chunk < 1:
        ap.error("--chunk must be at least 1")
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    test_file = os.path.abspath(args.test_file)
    if not os.path.isfile(test_file):
        ap.error(f"no test file at {test_file} (see bench/torch_conformance/README.md)")
    # Children inherit the driver's environment (route_env), so the
    # selection travels with it.
    if args.all_tests:
        os.environ["CMA_CONF_ALL_TESTS"] = "1"
    else:
        os.environ.pop("CMA_CONF_ALL_TESTS", None)
    os.makedirs(args.out, exist_ok=True)
    # Logs and event files live outside --out: the GPU machine returns few files.
    work = tempfile.mkdtemp(prefix="cma_conformance_")
    print(f"[conformance] logs in {work}; results in {args.out}", flush=True)
    end = time.time() + args.total_s
    slots = len(routes) * len(orders)
    by_order, fatal = {}, False
    for order in orders:
        results = by_order[order] = []
        for route in routes:
            share = (end - time.time()) / slots
            slots -= 1
            budget = max(min(args.route_s, share), 1.0)
            print(f"[conformance] {order}: route {route}: budget {budget:.0f} s", flush=True)
            if args.jobs > 1 and chunks[order]:
                import parallel
                r = parallel.run_route_jobs(route, test_file, args.out, budget, args.soft_s,
                                            args.hard_s, args.jobs, chunks[order],
                                            exclude=args.exclude, work_dir=work,
                                            only=args.only)
            else:
                r = run_route(route, test_file, args.out, budget, args.soft_s, args.hard_s,
                              exclude=args.exclude, work_dir=work, chunk=chunks[order],
                              only=args.only)
            results.append(r)
            fatal = fatal or bool(r["fatal"])
            s = r["summary"]
            print(f"[conformance] {order}: {route}: {r['selected']} selected, "
                  + ", ".join(f"{k} {v}" for k, v in s.items() if v)
                  + f"; {r['processes']} processes, {r['restarts']} restarts, {r['wall_s']} s"
                  + (f"; {r['jobs']} jobs, {r['rerun_alone']} re-run alone, "
                     f"{r['rerun_missed']} not re-run (budget)" if "jobs" in r else "")
                  + (f"; FATAL: {r['fatal']}" if r["fatal"] else ""), flush=True)
        report = compare.markdown(results)
        name = "compare.md" if order == "whole" else f"compare_{core.order_name(chunks[order])}.md"
        with open(os.path.join(args.out, name), "w") as f:
            f.write(report)
        print(compare.brief(report), flush=True)
    if len(orders) > 1:
        with open(os.path.join(args.out, "orders.md"), "w") as f:
            f.write(compare.orders_markdown(by_order))
    with tarfile.open(os.path.join(args.out, "logs.tar.gz"), "w:gz") as tar:
        tar.add(work, arcname="work")
    return 2 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
