"""pytest plugin of the conformance harness (loaded with -p conformance_plugin
by run_conformance.py; read its docstring for the whole picture).

At import, which pytest does before it collects anything, so before
test_cuda.py initialises CUDA:
  1. puts the stand-in modules (shims/) at the end of sys.path, where they
     serve only imports the installed packages cannot (expecttest, psutil);
  2. installs the route: cma -> cma.torch.use_as_default(); native and
     expandable leave PyTorch's allocator (the driver sets
     PYTORCH_CUDA_ALLOC_CONF for expandable);
  3. gives names test_cuda.py imports that this torch lacks a stand-in
     (import_fallbacks.py).
Then it keeps the keyword-selected tests (or the ones a crashed run left),
bounds each test's time (SIGALRM soft timeout, faulthandler hard exit), and
writes every test's outcome to the event log as soon as it is known.

Environment (set by the driver): CMA_CONF_ROUTE, CMA_CONF_EVENTS (event log),
CMA_CONF_TEST_FILE, CMA_CONF_ONLY (optional file: JSON list of ids to keep),
CMA_CONF_DEADLINE (epoch seconds), CMA_CONF_SOFT_TIMEOUT, CMA_CONF_HARD_TIMEOUT,
CMA_CONF_SLOW (JSON {substring: soft seconds} for tests known to compile),
CMA_CONF_EXCLUDE (JSON list of substrings: selected tests not to run),
CMA_CONF_INCLUDE (JSON list of substrings: when not empty, only selected
tests containing one of them are selected),
CMA_CONF_CHUNK (optional: run only the first N of what is left; the driver
starts the next process for the rest).
"""
import faulthandler
import hashlib
import json
import os
import platform
import signal
import sys
import time

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import conformance_core as core  # noqa: E402
import import_fallbacks  # noqa: E402

sys.path.append(os.path.join(_HERE, "shims"))

ROUTE = os.environ.get("CMA_CONF_ROUTE", "native")
EVENTS = core.EventWriter(os.environ["CMA_CONF_EVENTS"])
TEST_FILE = os.environ.get("CMA_CONF_TEST_FILE", "")
DEADLINE = float(os.environ.get("CMA_CONF_DEADLINE", "inf"))
SOFT = float(os.environ.get("CMA_CONF_SOFT_TIMEOUT", "40"))
HARD = float(os.environ.get("CMA_CONF_HARD_TIMEOUT", "60"))
SLOW = json.loads(os.environ.get("CMA_CONF_SLOW", "{}"))
EXCLUDE = json.loads(os.environ.get("CMA_CONF_EXCLUDE", "[]"))
INCLUDE = json.loads(os.environ.get("CMA_CONF_INCLUDE", "[]"))


class ConformanceTimeout(Exception):
    pass


def _fatal(msg):
    EVENTS.write("fatal", msg=msg)
    raise pytest.UsageError("conformance harness: " + msg)


def _install_route():
    info = {"route": ROUTE}
    import torch
    if torch.cuda.is_initialized():
        _fatal("CUDA was initialised before the route could be installed")
    if ROUTE == "cma":
        try:
            import cma.torch as cma_torch
            cma_torch.use_as_default()
        except Exception as e:  # the run would silently test native
            _fatal(f"cma.torch.use_as_default() failed: {type(e).__name__}: {e}")
        info["cma_module"] = getattr(sys.modules.get("cma"), "__file__", None)
    elif ROUTE == "expandable":
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        if "expandable_segments:True" not in conf:
            _fatal("route expandable needs PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    elif ROUTE != "native":
        _fatal(f"unknown route {ROUTE!r} (native, cma, expandable)")
    if torch.cuda.is_initialized():
        _fatal(f"installing route {ROUTE} initialised CUDA")
    return info


ROUTE_INFO = _install_route()
try:
    with open(TEST_FILE, encoding="utf-8") as _f:
        _SOURCE = _f.read()
except OSError as _e:
    _fatal(f"cannot read the test file {TEST_FILE!r}: {_e}")
try:
    FALLBACKS = import_fallbacks.apply(_SOURCE)
except Exception as _e:
    _fatal(f"preparing the test file's imports failed: {type(_e).__name__}: {_e}")


def pytest_collection_modifyitems(session, config, items):
    only = None
    only_file = os.environ.get("CMA_CONF_ONLY")
    if only_file:
        with open(only_file, encoding="utf-8") as f:
            only = json.load(f)
    selected = core.select([i.nodeid for i in items], keywords=core.selection_keywords(),
                           only=only)
    if INCLUDE:  # the driver's --only
        selected = [i for i in selected if any(p in i for p in INCLUDE)]
    excluded = core.excluded(selected, EXCLUDE)
    keep_ids = set(core.first_chunk([i for i in selected if i not in set(excluded)]))
    keep = [i for i in items if i.nodeid in keep_ids]
    dropped = [i for i in items if i.nodeid not in keep_ids]
    items[:] = keep
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    EVENTS.write("selected", ids=selected, excluded=excluded, collected=len(items) + len(dropped))


def pytest_collectreport(report):
    if report.failed:
        EVENTS.write("fatal", msg="collecting the test file failed: "
                     + core.reason_from_longrepr(report.longrepr))


def pytest_collection_finish(session):
    import torch
    meta = dict(ROUTE_INFO)
    meta.update(
        torch=torch.__version__, torch_cuda=torch.version.cuda, python=platform.python_version(),
        pytest=pytest.__version__, fallbacks=FALLBACKS,
        test_file=TEST_FILE,
        test_file_sha256=hashlib.sha256(_SOURCE.encode("utf-8")).hexdigest(),
        alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        selection=core.selection_name(core.selection_keywords()))
    for key, query in (("device", lambda: torch.cuda.get_device_name(0)),
                       ("allocator_backend", torch.cuda.get_allocator_backend)):
        try:
            meta[key] = query()
        except Exception as e:
            meta[key] = f"unknown ({type(e).__name__}: {e})"
    if ROUTE == "cma":
        meta["cma_owns_tensors"] = _cma_owns_a_tensor(torch)
    EVENTS.write("meta", **meta)
    if meta.get("cma_owns_tensors") is False:
        EVENTS.write("fatal", msg="route cma is installed but a 1 MiB tensor is not cma's")
        pytest.exit("conformance harness: cma does not own tensors", returncode=3)


def _cma_owns_a_tensor(torch):
    """True/False when cma can say whether it owns a tensor's memory; a
    string when it cannot (the check is advisory then).

    The tensor is one element, as test_cuda.py's own import makes (its cuDNN
    probe), and no empty_cache follows: a check that emptied cma's cache
    would start cma's tests from a state native's never see (a test that
    counts the pools present at its start, propagates_stream, read that as a
    difference of cma's)."""
    try:
        from cma import _lib
        t = torch.empty(1, device="cuda")
        owned = _lib.device_of(t.untyped_storage().data_ptr()) is not None
        del t
        return owned
    except Exception as e:
        return f"unknown ({type(e).__name__}: {e})"


def _soft_limit(nodeid):
    for part, seconds in SLOW.items():
        if part in nodeid:
            return float(seconds)
    return SOFT


def _on_alarm(signum, frame):
    raise ConformanceTimeout(f"{core.TIMEOUT_MARK}: the test ran past its soft limit")


_ACC = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    soft = _soft_limit(item.nodeid)
    _CURRENT["test"] = item.nodeid
    EVENTS.start(item.nodeid)
    _ACC[item.nodeid] = core.OutcomeAccumulator()
    began = time.time()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, soft)
    # A test stuck in C (a CUDA call, a lock) never sees SIGALRM; faulthandler's
    # watchdog thread dumps every stack and ends the process, and the driver
    # resumes after this test.
    # sys.__stderr__ is the process's real stderr (the driver runs pytest with
    # --capture=sys, so C++ messages of a dying process reach its log too).
    faulthandler.dump_traceback_later(soft + max(HARD - SOFT, 10.0), exit=True,
                                      file=sys.__stderr__)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()
        outcome, reason = _ACC.pop(item.nodeid).final()
        EVENTS.end(item.nodeid, outcome, reason, time.time() - began)
        _note_open_contexts(item.nodeid)
        if outcome not in core.OK_OUTCOMES and outcome not in ("skipped", "not_run"):
            broken = _cuda_context_broken()
            if broken:
                # A sticky CUDA error or an unfinished capture would fail every
                # later test for this one's sake: end the process; the driver
                # resumes with the next test in a fresh one.
                EVENTS.write("restart", after=item.nodeid, reason=core.one_line(broken))
                os._exit(RESTART_STATUS)


RESTART_STATUS = 75

# CMA_CONF_CONTEXT_LOG (optional, cma route): after each test, a line naming it
# when cma still has a pool context open on device 0 (it then makes no call
# that could break a capture: no population, event or release), so a test
# that leaves one open is found.
_CONTEXT_LOG = os.environ.get("CMA_CONF_CONTEXT_LOG")


# CMA_CONF_NVML_LOG (optional, a diagnostic): every call of
# torch.cuda.device_memory_used is logged there as JSON with what the process
# sees at that moment (cudaMemGetInfo, PyTorch's and cma's statistics), so a
# test that reads NVML can be explained. It wraps a torch function: never in
# a run whose results are compared.
_NVML_LOG = os.environ.get("CMA_CONF_NVML_LOG")
_CURRENT = {"test": None}


def _watch_nvml():
    import torch
    real = torch.cuda.device_memory_used

    def logged(*args, **kwargs):
        used = real(*args, **kwargs)
        rec = {"test": _CURRENT["test"], "nvml_used": used}
        try:
            rec["free"], rec["total"] = torch.cuda.mem_get_info()
            st = torch.cuda.memory_stats()
            for k in ("reserved_bytes.all.current", "allocated_bytes.all.current",
                      "active_bytes.all.current"):
                rec[k] = st.get(k)
            if ROUTE == "cma":
                import cma.torch as cma_torch
                cs = cma_torch.memory_stats(0)
                for k in ("idle_populated_bytes", "virtual_bytes", "num_pages_discarded",
                          "num_pages_populated", "host_staging_bytes.all.current"):
                    rec["cma." + k] = cs.get(k)
        except Exception as e:  # noqa: BLE001 - a diagnostic never fails the run
            rec["error"] = str(e)
        with open(_NVML_LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return used
    torch.cuda.device_memory_used = logged


if _NVML_LOG:
    _watch_nvml()


def _note_open_contexts(nodeid):
    if not _CONTEXT_LOG or ROUTE != "cma":
        return
    import ctypes
    lib = ctypes.CDLL(os.environ["CMA_LIBRARY"])
    with open(_CONTEXT_LOG, "a") as f:
        f.write(f"{lib.cma_allocating_to_pool(0)}\t{nodeid}\n")


def _cuda_context_broken():
    """A one-line reason when CUDA can no longer be used in this process
    (torch.cuda.synchronize() raises), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    faulthandler.dump_traceback_later(30.0, exit=True, file=sys.__stderr__)
    try:
        torch.cuda.synchronize()
        return None
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if time.time() > DEADLINE:
        pytest.skip(core.BUDGET_MARK)


def pytest_runtest_logreport(report):
    acc = _ACC.get(report.nodeid)
    if acc is None:
        return
    reason = "" if report.outcome == "passed" else core.reason_from_longrepr(report.longrepr)
    acc.add(report.when, report.outcome, reason, getattr(report, "wasxfail", None))
