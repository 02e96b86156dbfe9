"""--jobs N for the chunked run orders (chunks, each) of run_conformance.py:
up to N pytest children of one route at once, so that `each` (a torch import
and a collection of test_cuda.py per test, 13-20 s) fits a session.

Scheduling: the first child runs with no id list, exactly as the serial
driver's first child; its "selected" event gives the collection order, which
is cut into the same chunks the serial driver would run (the first is that
child's own); the rest go to a shared queue that N workers take from, each a
run_route-like loop (its own log, event files and id lists; per-test soft and
hard limits, crash attribution and resumption within its chunk). All
workers' outcomes fold into ONE result per route and order, with the fields
of the serial one (order = the full collection order), plus "jobs".

Concurrency itself can fail a test: test_cuda.py reads device-wide memory
(cudaMemGetInfo, NVML) and another process's allocations change it, and a
loaded machine can push a test past its time limit. So after the parallel
pass every test that ended failed, error, timeout or crashed runs again
ALONE (one fresh process each, nothing else running) while the budget
lasts; that outcome is the test's result, and the entry keeps the parallel
one ("rerun_alone": true, "parallel_outcome", "parallel_reason"). A test
the budget left no time to re-run keeps its parallel outcome, marked
"rerun_alone": false. The result counts both ("rerun_alone",
"rerun_missed").
"""
import json
import os
import threading
import time

import conformance_core as core
import run_conformance as rc

# Outcomes that another process running at the same time can cause.
RERUN_OUTCOMES = frozenset(("failed", "error", "timeout", "crashed"))


class ChunkQueue:
    """The chunks not yet handed to a worker. Unknown (take() waits) until
    the first child reports the selection; stop(why) hands out nothing more
    and keeps the first reason, which the driver gives every test left."""

    def __init__(self, chunks=None):
        self._cv = threading.Condition()
        self._chunks = None if chunks is None else list(chunks)
        self.stopped = None

    def publish(self, chunks):
        with self._cv:
            if self._chunks is None:
                self._chunks = list(chunks)
                self._cv.notify_all()

    @property
    def published(self):
        with self._cv:
            return self._chunks is not None

    def stop(self, why):
        with self._cv:
            if self.stopped is None:
                self.stopped = why
            self._cv.notify_all()

    def take(self):
        with self._cv:
            while self._chunks is None and self.stopped is None:
                self._cv.wait()
            if self.stopped is not None or not self._chunks:
                return None
            return self._chunks.pop(0)


def chunked(ids, size):
    return [ids[i:i + size] for i in range(0, len(ids), size)]


def discovered(events, ended=False):
    """The first child's "selected" event once it has started its first
    test (a fatal comes before that: a route that cannot be installed, a
    cma that does not own a tensor; no other child should start then), or
    at its end without a fatal; else None."""
    kinds = {ev.get("ev") for ev in events}
    if "selected" not in kinds or "fatal" in kinds or not (ended or "start" in kinds):
        return None
    return next(ev for ev in events if ev.get("ev") == "selected")


class _Route:
    """What the workers of one route share: settings, the result they all
    fold into (under `lock`), and the queue."""

    def __init__(self, result, queue, work, stem, deadline, settings):
        self.result, self.queue, self.work, self.stem = result, queue, work, stem
        self.deadline = deadline
        self.s = settings
        self.lock = threading.Lock()


def _worker(rt, name, discover):
    """One worker: takes a chunk, runs it in a fresh child, resumes after a
    crash within the chunk, takes the next; like run_route's loop. With
    `discover` its first child runs with no id list and publishes the
    chunks from the selection it reports."""
    s, result, tests = rt.s, rt.result, rt.result["tests"]
    stem = f"{rt.stem}.{name}"
    log_path = os.path.join(rt.work, f"{stem}.log")
    open(log_path, "w").close()
    found = {}

    def publish(events, ended=False):
        # The other workers wait for the selection: publish it at once.
        if not discover or "chunk" in found:
            return
        ev = discovered(events, ended)
        if ev is None:
            return
        # The order is the full selection: recorded before any other child
        # starts, as a child given a chunk reports only that chunk.
        with rt.lock:
            rc.take_selection(result, ev)
        excluded = set(ev.get("excluded", []))
        ids = [i for i in ev["ids"] if i not in excluded]
        found["chunk"] = ids[:s["chunk"]]
        rt.queue.publish(chunked(ids[s["chunk"]:], s["chunk"]))

    assigned = None if discover else rt.queue.take()
    if not discover and assigned is None:
        return
    remaining, attempt, unplanned = assigned, 0, False
    while True:
        if rt.queue.stopped is not None:
            return
        if time.time() > rt.deadline:
            rt.queue.stop(core.BUDGET_MARK)
            return
        with rt.lock:
            if result["restarts"] >= s["max_restarts"]:
                rt.queue.stop(f"not run: {s['max_restarts']} restarts used")
                return
            if unplanned:
                result["restarts"] += 1
        events_path = os.path.join(rt.work, f"{stem}.events.{attempt}.jsonl")
        if os.path.exists(events_path):
            os.remove(events_path)
        only_path = None
        if remaining is not None:
            only_path = os.path.join(rt.work, f"{stem}.only.{attempt}.json")
            with open(only_path, "w") as f:
                json.dump(remaining, f)
        env = rc.child_env(s["route"], events_path, s["test_file"], rt.deadline, s["soft_s"],
                           s["hard_s"], s["slow"], s["exclude"], s["chunk"], s["only"],
                           only_path)
        code, killed, log, events = rc.run_child(
            s["command"], s["test_file"], env, log_path, f"{stem} attempt {attempt}",
            rt.deadline, s["slow"], s["soft_s"], s["hard_s"], s["poll_s"], s["kill_grace_s"],
            publish)
        publish(events, ended=True)
        with rt.lock:
            result["processes"] += 1
            flight, progress, context_restarts = rc.fold_child(result, events, log, code,
                                                               killed, s["soft_s"])
            if result["fatal"]:
                rt.queue.stop(result["fatal"])
                return
            if remaining is None:
                if "chunk" not in found:
                    result["fatal"] = (f"no test was selected (collection "
                                       f"{rc.describe_exit(code)}): {rc.telling_line(log)}")
                    rt.queue.stop(result["fatal"])
                    return
                assigned = found["chunk"]
            remaining = [i for i in assigned if i not in tests]
        if time.time() > rt.deadline:
            rt.queue.stop(core.BUDGET_MARK)
            return
        if not flight and not progress:
            # Nothing ran in this process: restarting would loop.
            rt.queue.stop(f"not run: the process ended ({rc.describe_exit(code)}) "
                          "without running a test")
            return
        # A child that ran its chunk to the end is the plan, not a restart.
        unplanned = bool(flight or killed or context_restarts)
        if not remaining:
            assigned = remaining = rt.queue.take()
            if assigned is None:
                return
        attempt += 1


def _guarded_worker(rt, name, discover):
    # Workers wait in take() for the first one's selection: whatever ends a
    # worker, the queue must not be left unpublished and unstopped.
    try:
        _worker(rt, name, discover)
    except BaseException as e:
        rt.queue.stop(f"not run: the driver's worker {name} failed: {type(e).__name__}: {e}")
        raise
    finally:
        if discover and not rt.queue.published:
            rt.queue.stop("not run: no selection was reported")


def _run_workers(rt, jobs, discover):
    threads = [threading.Thread(target=_guarded_worker, args=(rt, f"w{k}", discover and k == 0),
                                name=f"conformance-{rt.stem}-w{k}", daemon=True)
               for k in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_route_jobs(route, test_file, out_dir, budget_s, soft_s, hard_s, jobs, chunk,
                   command=None, slow=None, max_restarts=rc.MAX_RESTARTS, poll_s=0.5,
                   kill_grace_s=rc.KILL_GRACE_S, exclude=(), work_dir=None, only=()):
    """run_route for a chunked order in up to `jobs` children at once, then
    the re-runs alone. Returns the route's result dict, written where
    run_route writes it."""
    assert chunk >= 1 and jobs >= 1
    started = time.time()
    deadline = started + budget_s
    command = command or rc.pytest_command(test_file)
    work = work_dir or os.path.join(out_dir, "work")
    os.makedirs(work, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    stem = rc.route_stem(route, chunk)
    result = rc.new_result(route, test_file, budget_s, soft_s, hard_s, command, exclude, chunk)
    result.update(jobs=jobs, rerun_alone=0, rerun_missed=0)
    settings = dict(route=route, test_file=test_file, soft_s=soft_s, hard_s=hard_s,
                    slow=slow, exclude=exclude, only=only, chunk=chunk, command=command,
                    max_restarts=max_restarts, poll_s=poll_s, kill_grace_s=kill_grace_s)
    rt = _Route(result, ChunkQueue(), work, stem, deadline, settings)
    _run_workers(rt, jobs, discover=True)
    tests = result["tests"]
    if not result["fatal"]:
        why = rt.queue.stopped or core.BUDGET_MARK
        for nodeid in result["order"] or []:
            if nodeid not in tests:
                tests[nodeid] = {"outcome": "not_run", "reason": why, "dur": None}
        _rerun_alone(result, work, stem, deadline, settings)
    position = {n: k for k, n in enumerate(result["order"] or [])}
    result["context_restarts"].sort(key=lambda c: position.get(c["after"], len(position)))
    return rc.finish_result(result, started, out_dir, work, stem)


def _rerun_alone(result, work, stem, deadline, settings):
    """Every test the parallel pass did not pass for a reason concurrency
    can cause runs again in its own process with nothing else running."""
    tests = result["tests"]
    suspects = [i for i in result["order"] if tests[i]["outcome"] in RERUN_OUTCOMES]
    if not suspects:
        return
    alone = rc.new_result(result["route"], result["test_file"], result["budget_s"],
                          result["soft_timeout_s"], result["hard_timeout_s"],
                          result["command"], result["exclude"], 1)
    alone.update(order=list(result["order"]), restarts=result["restarts"])
    rt = _Route(alone, ChunkQueue([[i] for i in suspects]), work, f"{stem}.alone", deadline,
                dict(settings, chunk=1))
    _run_workers(rt, 1, discover=False)
    result["processes"] += alone["processes"]
    result["restarts"] = alone["restarts"]
    seen = {c["after"] for c in result["context_restarts"]}
    result["context_restarts"] += [c for c in alone["context_restarts"] if c["after"] not in seen]
    if alone["fatal"] and not result["fatal"]:
        result["fatal"] = alone["fatal"]
    for nodeid in suspects:
        parallel = tests[nodeid]
        again = alone["tests"].get(nodeid)
        if again is None or again["outcome"] == "not_run":
            # The budget ran out first: the parallel outcome is all there is.
            parallel["rerun_alone"] = False
            result["rerun_missed"] += 1
            continue
        tests[nodeid] = dict(again, rerun_alone=True, parallel_outcome=parallel["outcome"],
                             parallel_reason=parallel["reason"])
        result["rerun_alone"] += 1
