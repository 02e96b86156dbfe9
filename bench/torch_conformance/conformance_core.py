"""Pure logic of the PyTorch conformance harness: which tests run, how a test's
reports become one outcome, the event log that a pytest child writes and its
parent reads, and the per-route summary.

Nothing here imports pytest or torch, so it is unit-tested on any machine
(conformance_test.py). The pytest glue is conformance_plugin.py; the driver
that restarts crashed children is run_conformance.py.

Event log: one JSON object a line, appended and flushed by the child so that
a child killed mid-test leaves every finished test on disk:
  {"ev": "meta", ...}                         torch, device, route facts
  {"ev": "selected", "ids": [...]}            the tests this child will run
  {"ev": "start", "id": ID, "t": EPOCH}       before a test's setup
  {"ev": "end", "id": ID, "outcome": O, "reason": R, "dur": S}
  {"ev": "restart", "after": ID, "reason": R} CUDA broke; the process ends
  {"ev": "fatal", "msg": M}                   the run cannot mean anything
A start without its end names the test that killed the process.
"""
import json
import os
import re
import time

# Names (case-insensitive) a test's "Class::method" id must contain to run:
# the allocator-facing part of test_cuda.py (issue 20, item 5).
KEYWORDS = ("graph", "memory", "snapshot", "out_of_memory", "caching_allocator",
            "mempool", "mem_pool")

# Every outcome a test can end with. "ok" ones count as conformance passes.
OUTCOMES = ("passed", "xfailed", "failed", "error", "xpassed", "skipped",
            "timeout", "crashed", "not_run")
OK_OUTCOMES = frozenset(("passed", "xfailed"))

# The reason strings the plugin uses for its own interventions; the
# accumulator turns them into outcomes of their own.
TIMEOUT_MARK = "ConformanceTimeout"
BUDGET_MARK = "conformance budget exhausted"

REASON_MAX = 240


def test_key(nodeid):
    """The part of a pytest node id that keywords match: "Class::method[...]"
    without the file path (a path such as .../graph_tests/ must not select)."""
    parts = nodeid.split("::")
    return "::".join(parts[1:]) if len(parts) > 1 else nodeid


def matches_keywords(nodeid, keywords=KEYWORDS):
    key = test_key(nodeid).lower()
    return any(k.lower() in key for k in keywords)


def selection_keywords(environ=None):
    """The keywords a child selects by: KEYWORDS, or none at all (every test
    of the file) when the driver's --all-tests set CMA_CONF_ALL_TESTS=1."""
    environ = os.environ if environ is None else environ
    return () if environ.get("CMA_CONF_ALL_TESTS") == "1" else KEYWORDS


def selection_name(keywords):
    return ("every test of the file" if not keywords else
            "tests whose Class::name contains any of: " + ", ".join(keywords))


def select(nodeids, keywords=KEYWORDS, only=None):
    """Keeps collection order. No keywords select every id. `only` (a list of
    ids, e.g. the tests left after a crash) restricts the selection further."""
    keep = [n for n in nodeids if not keywords or matches_keywords(n, keywords)]
    if only is not None:
        wanted = set(only)
        keep = [n for n in keep if n in wanted]
    return keep


def excluded(nodeids, patterns):
    """The ids containing any of `patterns` (the driver's --exclude)."""
    return [n for n in nodeids if any(p in n for p in patterns)]


EXCLUDED_MARK = "excluded by --exclude"


def one_line(text, limit=REASON_MAX):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def reason_from_longrepr(longrepr):
    """One line saying why a test did not pass, from what pytest reports:
    a (path, line, message) tuple for skips, an object with .reprcrash for
    failures, or plain text."""
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        msg = str(longrepr[2])
        return one_line(msg[len("Skipped: "):] if msg.startswith("Skipped: ") else msg)
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return one_line(crash.message)
    text = str(longrepr)
    # pytest's text form marks the exception lines with "E   ".
    e_lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
    if e_lines:
        return one_line(e_lines[-1] if len(e_lines) == 1 else _first_exception(e_lines))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return one_line(lines[-1] if lines else text)


def _first_exception(e_lines):
    # The "SomeError: message" line is more telling than a trailing diff line.
    for ln in e_lines:
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Timeout|Failure)\b", ln):
            return ln
    return e_lines[0]


class OutcomeAccumulator:
    """Folds the setup/call/teardown reports of one test into one outcome.

    add(when, outcome, reason, wasxfail) takes pytest's report fields;
    final() gives (outcome, reason). A failure in any phase wins over a pass;
    a setup failure is an "error" (the test body never ran)."""

    def __init__(self):
        self._phases = {}

    def add(self, when, outcome, reason="", wasxfail=None):
        self._phases[when] = (outcome, reason or "", wasxfail)

    def final(self):
        if not self._phases:
            return "crashed", "no report for any phase"
        setup = self._phases.get("setup")
        call = self._phases.get("call")
        teardown = self._phases.get("teardown")
        for phase in (setup, call, teardown):
            if phase and _is_mark(phase[1], TIMEOUT_MARK):
                return "timeout", phase[1]
        if setup and setup[0] == "skipped":
            return _skip_outcome(setup)
        if setup and setup[0] == "failed":
            return "error", setup[1]
        if call is None:
            return "error", "no call phase was reported"
        outcome, reason, wasxfail = call
        if wasxfail is not None:
            outcome = "xfailed" if outcome == "skipped" else "xpassed"
            reason = reason or str(wasxfail)
        elif outcome == "skipped":
            return _skip_outcome(call)
        if teardown and teardown[0] == "failed" and outcome in ("passed", "xfailed"):
            return "error", "teardown: " + teardown[1]
        return outcome, reason


def _is_mark(reason, mark):
    return mark.lower() in (reason or "").lower()


def _skip_outcome(phase):
    if _is_mark(phase[1], BUDGET_MARK):
        return "not_run", phase[1]
    return "skipped", phase[1]


class EventWriter:
    """Appends events to the log, flushing each so a killed child loses none."""

    def __init__(self, path):
        self._f = open(path, "a", encoding="utf-8")

    def write(self, ev, **fields):
        fields["ev"] = ev
        self._f.write(json.dumps(fields, default=str) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self):
        self._f.close()

    def start(self, nodeid):
        self.write("start", id=nodeid, t=time.time())

    def end(self, nodeid, outcome, reason, dur):
        self.write("end", id=nodeid, outcome=outcome, reason=reason, dur=round(dur, 3))


def read_events(path):
    """Events of a log; a torn last line (process killed mid-write) is dropped."""
    events = []
    if not os.path.exists(path):
        return events
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def in_flight(events):
    """(id, start time) of the test that started but never ended, or None."""
    ended = {e["id"] for e in events if e.get("ev") == "end"}
    for e in reversed(events):
        if e.get("ev") == "start" and e["id"] not in ended:
            return e["id"], e.get("t", 0.0)
    return None


def summarize(order, results):
    counts = {o: 0 for o in OUTCOMES}
    for nodeid in order:
        counts[results.get(nodeid, {}).get("outcome", "not_run")] += 1
    return counts


def first_chunk(ids, size=None):
    """The tests one process runs when the driver splits the selection into
    fresh processes of `size` tests in collection order (CMA_CONF_CHUNK,
    unset or 0: all of them). PyTorch's tests leave state behind (caches,
    pools, graphs), so an outcome that changes with what ran before in the
    same process is not conformance: the driver runs each order apart."""
    if size is None:
        size = int(os.environ.get("CMA_CONF_CHUNK", "0") or 0)
    return list(ids) if size <= 0 else list(ids)[:size]


def order_name(chunk):
    """The name of a run order in result files: whole (one process for the
    selection, as PyTorch's CI runs the file), chunksN, or each (N = 1)."""
    if not chunk:
        return "whole"
    return "each" if chunk == 1 else f"chunks{chunk}"

