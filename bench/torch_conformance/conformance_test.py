"""Tests of the conformance harness that need neither torch nor a GPU.

- the pure logic (selection, outcome folding, reasons, event log);
- import stand-ins on a fake module;
- the driver's restart, timeout and budget handling with a fake child
  process that speaks the event-log protocol, serially and with --jobs
  (parallel.py), including a test that fails only while another child runs;
- when the interpreter has pytest: the real plugin under pytest on a fake
  torch and a fake cma, a test file whose tests pass, fail, skip, xfail,
  crash the process, overrun their soft limit, get stuck where SIGALRM cannot
  reach them, and import names the fake torch lacks.
"""
import importlib.util
import json
import os
import sys
import tempfile
import textwrap
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import compare  # noqa: E402
from conformance_fakes import FAKE_CHILD, FAKE_EXPECT, FAKE_TEST_FILE, FAKE_TORCH  # noqa: E402
import conformance_core as core  # noqa: E402
import import_fallbacks  # noqa: E402
import parallel  # noqa: E402
import run_conformance  # noqa: E402


class CoreTest(unittest.TestCase):
    def test_keywords_match_class_and_method_not_path(self):
        self.assertTrue(core.matches_keywords("t.py::TestMemPool::test_x"))
        self.assertTrue(core.matches_keywords("t.py::TestCuda::test_OUT_OF_MEMORY"))
        self.assertTrue(core.matches_keywords("t.py::TestCudaOptimsCUDA::test_graph_optims_SGD"))
        self.assertFalse(core.matches_keywords("graph_dir/t.py::TestCuda::test_streams"))
        ids = ["a.py::A::test_streams", "a.py::A::test_memory_stats", "a.py::A::test_graph_x"]
        self.assertEqual(core.select(ids), ids[1:])
        self.assertEqual(core.select(ids, only=["a.py::A::test_graph_x", "a.py::A::test_streams"]),
                         ["a.py::A::test_graph_x"])

    def test_no_keywords_select_every_test_and_the_driver_says_which(self):
        ids = ["a.py::A::test_streams", "a.py::A::test_memory_stats", "a.py::A::test_graph_x"]
        self.assertEqual(core.select(ids, keywords=()), ids)
        self.assertEqual(core.select(ids, keywords=(), only=["a.py::A::test_streams"]), ids[:1])
        self.assertEqual(core.selection_keywords({}), core.KEYWORDS)
        self.assertEqual(core.selection_keywords({"CMA_CONF_ALL_TESTS": "0"}), core.KEYWORDS)
        self.assertEqual(core.selection_keywords({"CMA_CONF_ALL_TESTS": "1"}), ())
        self.assertIn("every test", core.selection_name(()))
        self.assertIn("mempool", core.selection_name(core.KEYWORDS))

    def test_outcome_folding(self):
        def fold(*phases):
            acc = core.OutcomeAccumulator()
            for p in phases:
                acc.add(*p)
            return acc.final()
        self.assertEqual(fold(("setup", "passed"), ("call", "passed"), ("teardown", "passed")),
                         ("passed", ""))
        self.assertEqual(fold(("setup", "passed"), ("call", "failed", "AssertionError: x"),
                              ("teardown", "passed")), ("failed", "AssertionError: x"))
        self.assertEqual(fold(("setup", "failed", "boom")), ("error", "boom"))
        self.assertEqual(fold(("setup", "skipped", "no gpu")), ("skipped", "no gpu"))
        self.assertEqual(fold(("setup", "skipped", core.BUDGET_MARK))[0], "not_run")
        self.assertEqual(fold(("setup", "passed"), ("call", "skipped", "", "reason")),
                         ("xfailed", "reason"))
        self.assertEqual(fold(("setup", "passed"), ("call", "passed", "", ""))[0], "xpassed")
        self.assertEqual(fold(("setup", "passed"), ("call", "passed"),
                              ("teardown", "failed", "leak")), ("error", "teardown: leak"))
        self.assertEqual(fold(("setup", "passed"),
                              ("call", "failed", "ConformanceTimeout: past limit"))[0], "timeout")
        self.assertEqual(fold()[0], "crashed")

    def test_reasons(self):
        self.assertEqual(core.reason_from_longrepr(("f.py", 3, "Skipped: no cuda")), "no cuda")
        crash = types.SimpleNamespace(reprcrash=types.SimpleNamespace(
            message="RuntimeError: cma.torch: does not yet support\n  more"))
        self.assertEqual(core.reason_from_longrepr(crash),
                         "RuntimeError: cma.torch: does not yet support more")
        text = "def test():\n>   x()\nE   RuntimeError: out of memory\nE   second line\nt.py:3: RuntimeError"
        self.assertEqual(core.reason_from_longrepr(text), "RuntimeError: out of memory")
        self.assertEqual(len(core.one_line("x" * 1000)), core.REASON_MAX)

    def test_event_log_survives_a_torn_line(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "ev.jsonl")
            w = core.EventWriter(path)
            w.start("a")
            w.end("a", "passed", "", 0.1)
            w.start("b")
            with open(path, "a") as f:
                f.write('{"ev": "end", "id": "b", "outc')
            events = core.read_events(path)
            self.assertEqual([e["ev"] for e in events], ["start", "end", "start"])
            self.assertEqual(core.in_flight(events)[0], "b")
            w.close()


class FallbackTest(unittest.TestCase):
    def setUp(self):
        mod = types.ModuleType("fakepkg.helpers")
        mod.present = "here"
        pkg = types.ModuleType("fakepkg")
        sys.modules.update({"fakepkg": pkg, "fakepkg.helpers": mod})
        self.addCleanup(lambda: [sys.modules.pop(m, None)
                                 for m in ("fakepkg", "fakepkg.helpers", "fakepkg.gone")])

    def test_a_module_missing_a_dependency_is_an_error(self):
        def importer(name):
            raise ModuleNotFoundError("No module named 'yaml'", name="yaml")
        with self.assertRaisesRegex(import_fallbacks.MissingDependency, "needs the package 'yaml'"):
            import_fallbacks.apply("from fakepkg.helpers import x\n", prefixes=("fakepkg",),
                                   importer=importer)

    def test_missing_names_get_stand_ins(self):
        source = textwrap.dedent("""
            import os
            from fakepkg.helpers import (present, TEST_NEW_FEATURE, PLATFORM_SUPPORTS_X,
                newDecorator, serialTest, MI999_ARCH, thing_db, TestNewBase,
                _get_torch_cuda_version)
            from fakepkg.gone import other
            from collections import OrderedDict
            """)
        applied = import_fallbacks.apply(source, prefixes=("fakepkg",))
        names = {(a["module"], a["name"]) for a in applied}
        self.assertNotIn(("fakepkg.helpers", "present"), names)
        self.assertIn(("fakepkg.gone", "*"), names)
        self.assertIn(("fakepkg.gone", "other"), names)
        ns = {}
        exec(source + textwrap.dedent("""
            import unittest
            class T(unittest.TestCase):
                @newDecorator("arg", flag=True)
                def test_decorated(self):
                    pass
                @serialTest()
                def test_serial(self):
                    pass
                def test_attr(self):
                    other.anything
            class U(TestNewBase):
                def test_u(self):
                    pass
            flags = (TEST_NEW_FEATURE, PLATFORM_SUPPORTS_X, MI999_ARCH, list(thing_db))
            """), ns)
        self.assertEqual(ns["flags"], (False, False, (), []))
        result = unittest.TestResult()
        unittest.defaultTestLoader.loadTestsFromTestCase(ns["T"]).run(result)
        unittest.defaultTestLoader.loadTestsFromTestCase(ns["U"]).run(result)
        skipped = {t.id().split(".")[-1]: why for t, why in result.skipped}
        self.assertEqual(set(skipped), {"test_decorated", "test_attr", "test_u"})
        self.assertIn("newDecorator is missing", skipped["test_decorated"])
        self.assertEqual(result.testsRun, 4)
        self.assertEqual(result.failures + result.errors, [])


class DriverTest(unittest.TestCase):
    def run_fake(self, budget=30.0, env=None):
        d = tempfile.mkdtemp()
        child = os.path.join(d, "child.py")
        with open(child, "w") as f:
            f.write(FAKE_CHILD)
        old = dict(os.environ)
        os.environ.update(HARNESS_DIR=HERE, **(env or {}))
        try:
            return run_conformance.run_route(
                "cma", child, d, budget, soft_s=0.5, hard_s=1.0,
                command=[sys.executable, child], slow={}, poll_s=0.1, kill_grace_s=1.0), d
        finally:
            os.environ.clear()
            os.environ.update(old)

    def test_crash_and_hang_are_recorded_and_the_run_resumes(self):
        r, d = self.run_fake()
        t = {core.test_key(k): v for k, v in r["tests"].items()}
        self.assertEqual(r["order"], ["f.py::T::test_graph_a", "f.py::T::test_memory_crash",
                                      "f.py::T::test_graph_hang", "f.py::T::test_snapshot_b",
                                      "f.py::T::test_mempool_slow"])
        self.assertEqual(t["T::test_graph_a"]["outcome"], "passed")
        self.assertEqual(t["T::test_memory_crash"]["outcome"], "crashed")
        self.assertIn("SIGABRT", t["T::test_memory_crash"]["reason"])
        self.assertIn("fake allocator abort", t["T::test_memory_crash"]["reason"])
        self.assertEqual(t["T::test_graph_hang"]["outcome"], "timeout")
        self.assertEqual(t["T::test_snapshot_b"]["outcome"], "passed")
        self.assertEqual(r["restarts"], 2)
        self.assertIsNone(r["fatal"])
        self.assertEqual(r["summary"]["passed"], 3)
        with open(os.path.join(d, "cma.json")) as f:
            self.assertEqual(json.load(f)["summary"], r["summary"])

    def test_budget_marks_the_rest_not_run(self):
        r, _ = self.run_fake(budget=0.3, env={"FAKE_SLOW_S": "0"})
        outcomes = [r["tests"][i]["outcome"] for i in r["order"]]
        self.assertIn("not_run", outcomes)
        self.assertEqual(r["summary"]["not_run"] + r["summary"]["passed"]
                         + r["summary"]["crashed"] + r["summary"]["timeout"], len(r["order"]))

    def run_chunked(self, chunk):
        d = tempfile.mkdtemp()
        child = os.path.join(d, "child.py")
        with open(child, "w") as f:
            f.write(FAKE_CHILD)
        old = dict(os.environ)
        os.environ.update(HARNESS_DIR=HERE, FAKE_SLOW_S="0")
        try:
            return run_conformance.run_route(
                "cma", child, d, 60.0, soft_s=0.5, hard_s=1.0, command=[sys.executable, child],
                slow={}, poll_s=0.1, kill_grace_s=1.0, chunk=chunk), d
        finally:
            os.environ.clear()
            os.environ.update(old)

    def test_chunks_run_in_fresh_processes_and_only_crashes_count_as_restarts(self):
        whole, _ = self.run_fake(env={"FAKE_SLOW_S": "0"})
        for chunk, processes in ((2, 3), (1, 5)):
            r, d = self.run_chunked(chunk)
            self.assertEqual(r["order"], whole["order"])
            self.assertEqual({k: v["outcome"] for k, v in r["tests"].items()},
                             {k: v["outcome"] for k, v in whole["tests"].items()})
            # chunk 2: [a, crash] dies, [hang, b] is killed, [b, slow] ends as
            # planned; chunk 1: every test its own process, two of them died.
            self.assertEqual((r["processes"], r["restarts"]), (processes, 2), chunk)
            self.assertEqual(r["run_order"], core.order_name(chunk))
            name = "cma_each.json" if chunk == 1 else "cma_chunks2.json"
            self.assertTrue(os.path.exists(os.path.join(d, name)), name)
        self.assertEqual((whole["processes"], whole["run_order"]), (3, "whole"))

    def test_fatal_stops_the_route(self):
        r, _ = self.run_fake(env={"FAKE_FATAL": "1"})
        self.assertEqual(r["fatal"], "route install failed")
        self.assertEqual(r["order"], None)


class ParallelTest(unittest.TestCase):
    """--jobs on the fake child: one result per route and order, as the
    serial driver's, whatever the children do at the same time."""

    CRASH, HANG = "f.py::T::test_memory_crash", "f.py::T::test_graph_hang"
    WIDE = "f.py::T::test_memory_device_wide"

    def run_jobs(self, chunk, jobs, budget=60.0, env=None, slow=None):
        d = tempfile.mkdtemp()
        child = os.path.join(d, "child.py")
        with open(child, "w") as f:
            f.write(FAKE_CHILD)
        old = dict(os.environ)
        os.environ.update(dict(dict(HARNESS_DIR=HERE, FAKE_SLOW_S="0",
                                    FAKE_LOCK=os.path.join(d, "gpu")), **(env or {})))
        kw = dict(command=[sys.executable, child], slow=slow or {}, poll_s=0.1, kill_grace_s=1.0)
        try:
            if jobs == 1:
                r = run_conformance.run_route("cma", child, d, budget, 0.5, 1.0, chunk=chunk, **kw)
            else:
                r = parallel.run_route_jobs("cma", child, d, budget, 0.5, 1.0, jobs, chunk, **kw)
        finally:
            os.environ.clear()
            os.environ.update(old)
        return r, d

    @staticmethod
    def starts(d, pattern):
        """How often each test started in the children whose event files
        match `pattern` (a run's parallel pass, or its re-runs)."""
        import glob
        counts = {}
        for path in glob.glob(os.path.join(d, "work", pattern)):
            for ev in core.read_events(path):
                if ev.get("ev") == "start":
                    counts[ev["id"]] = counts.get(ev["id"], 0) + 1
        return counts

    def test_jobs_give_the_serial_result_in_collection_order(self):
        for chunk in (1, 2):
            serial, _ = self.run_jobs(chunk, 1)
            # The first child (the one whose selection is the order) ends last.
            r, d = self.run_jobs(chunk, 3, env={"FAKE_A_S": "0.8"})
            name = core.order_name(chunk)
            self.assertEqual(r["order"], serial["order"])
            # Every test started exactly once in the parallel pass.
            self.assertEqual(self.starts(d, f"cma_{name}.w*.events.*"),
                             {i: 1 for i in serial["order"]}, chunk)
            self.assertEqual({k: v["outcome"] for k, v in r["tests"].items()},
                             {k: v["outcome"] for k, v in serial["tests"].items()}, chunk)
            self.assertEqual(r["summary"], serial["summary"])
            self.assertEqual((r["jobs"], r["run_order"], r["selected"]), (3, name, 5))
            self.assertNotIn("jobs", serial)
            with open(os.path.join(d, f"cma_{name}.json")) as f:
                self.assertEqual(json.load(f)["tests"], r["tests"])
            with open(os.path.join(d, "work", f"cma_{name}_outcomes.txt")) as f:
                self.assertEqual(f.read(), compare.outcome_list(serial))
            # The crash and the hang ran again alone, and did the same.
            self.assertEqual(self.starts(d, f"cma_{name}.alone.*.events.*"),
                             {self.CRASH: 1, self.HANG: 1})
            self.assertEqual((r["rerun_alone"], r["rerun_missed"]), (2, 0))
            for nodeid, outcome in ((self.CRASH, "crashed"), (self.HANG, "timeout")):
                t = r["tests"][nodeid]
                self.assertEqual((t["rerun_alone"], t["parallel_outcome"], t["outcome"]),
                                 (True, outcome, outcome))
            self.assertNotIn("rerun_alone", r["tests"]["f.py::T::test_graph_a"])

    def test_a_test_failing_only_beside_another_process_is_rerun_alone(self):
        env = {"FAKE_DEVICE_WIDE": "1", "FAKE_START_S": "0.3"}
        serial, _ = self.run_jobs(1, 1, env=env)
        self.assertEqual(serial["tests"][self.WIDE]["outcome"], "passed")
        r, d = self.run_jobs(1, 3, env=env)
        t = r["tests"][self.WIDE]
        self.assertEqual((t["outcome"], t["rerun_alone"], t["parallel_outcome"]),
                         ("passed", True, "failed"), t)
        self.assertIn("another process", t["parallel_reason"])
        self.assertEqual(r["rerun_alone"], 3)
        self.assertEqual({k: v["outcome"] for k, v in r["tests"].items()},
                         {k: v["outcome"] for k, v in serial["tests"].items()})
        self.assertEqual(r["order"], serial["order"])

    def test_a_crash_in_one_worker_loses_nothing_of_another(self):
        # Chunks of 3 in 2 workers: w0 [a, crash, hang] dies twice while w1
        # runs [snapshot_b, mempool_slow] in one process.
        r, d = self.run_jobs(3, 2, env={"FAKE_SLOW_S": "0.5"})
        outcomes = {core.test_key(k): v["outcome"] for k, v in r["tests"].items()}
        self.assertEqual(outcomes, {"T::test_graph_a": "passed", "T::test_memory_crash": "crashed",
                                    "T::test_graph_hang": "timeout", "T::test_snapshot_b": "passed",
                                    "T::test_mempool_slow": "passed"})
        with open(os.path.join(d, "work", "cma_chunks3.w1.log")) as f:
            self.assertEqual(f.read().count("===== "), 1)
        self.assertEqual(self.starts(d, "cma_chunks3.w1.events.*"),
                         {"f.py::T::test_snapshot_b": 1, "f.py::T::test_mempool_slow": 1})
        # w0: 2 children, w1: 1, the re-runs: 2; a fresh child after each crash.
        self.assertEqual((r["processes"], r["restarts"]), (5, 2))

    def test_the_budget_holds_and_every_test_gets_an_outcome(self):
        # mempool_slow may take 30 s: the budget, not its limit, stops it.
        r, _ = self.run_jobs(1, 3, budget=2.0, env={"FAKE_SLOW_S": "30"}, slow={"slow": 30})
        self.assertLess(r["wall_s"], 2.0 + 1.0 + 1.5)   # budget, kill grace, polling
        self.assertEqual(set(r["tests"]), set(r["order"]))
        self.assertEqual(sum(r["summary"].values()), len(r["order"]))
        self.assertEqual(r["tests"]["f.py::T::test_mempool_slow"]["outcome"], "not_run")
        # No time was left to re-run the crash alone: its parallel outcome stays.
        crash = r["tests"][self.CRASH]
        self.assertEqual((crash["outcome"], crash["rerun_alone"]), ("crashed", False))
        self.assertNotIn("parallel_outcome", crash)
        self.assertGreaterEqual(r["rerun_missed"], 1)
        self.assertEqual(r["rerun_alone"], 0)

    def test_fatal_starts_no_other_child(self):
        r, _ = self.run_jobs(1, 3, env={"FAKE_FATAL": "1"})
        self.assertEqual((r["fatal"], r["order"], r["processes"]), ("route install failed", None, 1))

    def test_bad_jobs_are_refused(self):
        with tempfile.NamedTemporaryFile(suffix=".py") as f:
            with self.assertRaises(SystemExit):
                run_conformance.main(["--out", tempfile.mkdtemp(), "--test-file", f.name,
                                      "--jobs", "0"])


class OrdersTest(unittest.TestCase):
    def test_first_chunk_and_order_names(self):
        self.assertEqual(core.first_chunk(["a", "b", "c"], 2), ["a", "b"])
        self.assertEqual(core.first_chunk(["a", "b"], 0), ["a", "b"])
        self.assertEqual([core.order_name(c) for c in (0, 1, 20)], ["whole", "each", "chunks20"])

    def test_orders_side_by_side_name_what_depends_on_the_order(self):
        order = ["f.py::T::test_a", "f.py::T::test_b"]

        def res(route, a, b):
            return {"route": route, "order": order, "processes": 1,
                    "tests": {order[0]: {"outcome": a}, order[1]: {"outcome": b, "reason": "r"}}}
        md = compare.orders_markdown({
            "whole": [res("native", "passed", "passed"), res("cma", "passed", "passed")],
            "each": [res("native", "passed", "passed"), res("cma", "passed", "failed")]})
        self.assertIn("| each | cma | 2 | 1 | 0 | 1 |", md)
        self.assertIn("## whole: native passes, cma does not (0)", md)
        self.assertIn("## each: native passes, cma does not (1)\n\n- T::test_b: failed: r", md)
        self.assertIn("## cma: outcome depends on the order (1)\n\n- T::test_b: passes in "
                      "whole; not in each", md)
        self.assertIn("## native: outcome depends on the order (0)", md)

    def test_bad_orders_are_refused(self):
        with tempfile.NamedTemporaryFile(suffix=".py") as f:
            for bad in (["--orders", "twice,twice"], ["--orders", "sideways"],
                        ["--chunk", "0", "--orders", "chunks"]):
                with self.assertRaises(SystemExit):
                    run_conformance.main(["--out", tempfile.mkdtemp(), "--test-file", f.name]
                                         + bad)


class CompareTest(unittest.TestCase):
    def test_lists_what_native_passes_and_cma_does_not(self):
        order = ["f.py::T::test_a", "f.py::T::test_b", "f.py::T::test_c"]
        native = {"route": "native", "order": order, "meta": {"torch": "2.11"}, "tests": {
            order[0]: {"outcome": "passed"}, order[1]: {"outcome": "passed"},
            order[2]: {"outcome": "failed", "reason": "x"}}}
        cma = {"route": "cma", "order": order, "meta": {}, "tests": {
            order[0]: {"outcome": "passed"},
            order[1]: {"outcome": "failed", "reason": "RuntimeError: graph | refused"},
            order[2]: {"outcome": "passed"}}}
        md = compare.markdown([native, cma])
        self.assertIn("## native passes, cma does not (1)", md)
        self.assertIn("| T::test_b | failed | RuntimeError: graph \\| refused |", md)
        self.assertIn("## cma passes, native does not (1)", md)
        self.assertIn("| native | 3 | 2 | 0 | 1 |", md)
        self.assertEqual(compare.outcome_list(cma).splitlines()[1],
                         "failed\tT::test_b\tRuntimeError: graph | refused")


def _has_pytest():
    return importlib.util.find_spec("pytest") is not None


def _run_fake_route(route, test_text, timeout_s, skip=(), jobs=1, **kwargs):
    """Runs run_conformance.run_route (parallel.run_route_jobs with `jobs` >
    1) on `test_text` as test_cuda.py against the fake torch (FAKE_TORCH,
    without the files under `skip` prefixes) on PYTHONPATH; returns (result,
    temporary folder)."""
    d = tempfile.mkdtemp()
    site = os.path.join(d, "site")
    for rel, text in FAKE_TORCH.items():
        if rel.startswith(tuple(skip)):
            continue
        path = os.path.join(site, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))
    test_file = os.path.join(d, "test_cuda.py")
    with open(test_file, "w") as f:
        f.write(test_text)
    old = dict(os.environ)
    os.environ["PYTHONPATH"] = site
    try:
        if jobs > 1:
            r = parallel.run_route_jobs(route, test_file, os.path.join(d, "out"), timeout_s,
                                        1.0, 3.0, jobs, kwargs.pop("chunk"), slow={}, poll_s=0.1,
                                        **kwargs)
        else:
            r = run_conformance.run_route(route, test_file, os.path.join(d, "out"), timeout_s,
                                          soft_s=1.0, hard_s=3.0, slow={}, poll_s=0.1, **kwargs)
    finally:
        os.environ.clear()
        os.environ.update(old)
    return r, d


@unittest.skipUnless(_has_pytest(), "this interpreter has no pytest")
class PluginUnderPytestTest(unittest.TestCase):
    def test_cma_route_end_to_end(self):
        r, d = _run_fake_route("cma", FAKE_TEST_FILE, 120, exclude=["test_memory_excluded"])
        with open(os.path.join(d, "out", "work", "cma.log")) as f:
            log = f.read()
        self.assertIsNone(r["fatal"], log[-3000:])
        t = {core.test_key(k).split("::")[-1]: v for k, v in r["tests"].items()}
        self.assertNotIn("test_streams_is_not_selected", t)
        self.assertEqual(len(t), 13, t)
        self.assertEqual({k: v["outcome"] for k, v in t.items()}, FAKE_EXPECT, log[-3000:])
        self.assertIn("graph capture refused", t["test_graph_fails"]["reason"])
        self.assertIn("SIGABRT", t["test_out_of_memory_kills_the_process"]["reason"])
        self.assertIn("brandNewDecorator is missing",
                      t["test_memory_uses_a_missing_decorator"]["reason"])
        self.assertEqual(r["restarts"], 3)
        self.assertEqual([c["after"].split("::")[-1] for c in r["context_restarts"]],
                         ["test_graph_breaks_the_context"])
        self.assertIn("illegal memory access", r["context_restarts"][0]["reason"])
        meta = r["meta"]
        self.assertEqual(meta["device"], "FakeGPU")
        self.assertIs(meta["cma_owns_tensors"], True)
        self.assertIn("mempool", meta["selection"])
        self.assertEqual({f["name"] for f in meta["fallbacks"]}, {"TEST_BRAND_NEW", "brandNewDecorator"})

    def test_all_tests_selects_what_the_keywords_leave_out(self):
        os.environ["CMA_CONF_ALL_TESTS"] = "1"
        try:
            r, d = _run_fake_route("native", FAKE_TEST_FILE, 120,
                                   exclude=["test_memory_excluded"])
        finally:
            del os.environ["CMA_CONF_ALL_TESTS"]
        t = {core.test_key(k).split("::")[-1]: v for k, v in r["tests"].items()}
        self.assertEqual(t["test_streams_is_not_selected"]["outcome"], "passed")
        self.assertEqual(len(t), 14, t)
        self.assertEqual(r["meta"]["selection"], "every test of the file")
        self.assertIn("every test of the file", compare.markdown([r]))

    def test_cma_route_in_three_jobs_each_test_alone(self):
        # The first child's selection, from the real plugin, feeds the queue.
        r, d = _run_fake_route("cma", FAKE_TEST_FILE, 120, exclude=["test_memory_excluded"],
                               jobs=3, chunk=1)
        logs = ""
        for name in sorted(os.listdir(os.path.join(d, "out", "work"))):
            if name.endswith(".log"):
                with open(os.path.join(d, "out", "work", name)) as f:
                    logs += f.read()
        self.assertIsNone(r["fatal"], logs[-3000:])
        first = core.read_events(os.path.join(d, "out", "work", "cma_each.w0.events.0.jsonl"))
        self.assertEqual(r["order"], next(e["ids"] for e in first if e["ev"] == "selected"))
        t = {core.test_key(k).split("::")[-1]: v for k, v in r["tests"].items()}
        self.assertEqual({k: v["outcome"] for k, v in t.items()}, FAKE_EXPECT, logs[-3000:])
        self.assertEqual(set(r["tests"]), set(r["order"]))
        # failed, crashed and timed-out tests ran again alone and did the same.
        again = {k for k, v in t.items() if v.get("rerun_alone")}
        self.assertEqual(again, {k for k, o in FAKE_EXPECT.items()
                                 if o in parallel.RERUN_OUTCOMES})
        self.assertEqual(r["rerun_alone"], len(again))
        self.assertEqual(r["meta"]["device"], "FakeGPU")
        self.assertEqual((r["jobs"], r["run_order"]), (3, "each"))

    def test_a_file_that_does_not_import_is_fatal(self):
        r, _ = _run_fake_route(
            "native", "import no_such_module_anywhere\n\ndef test_memory():\n    pass\n", 60)
        self.assertIn("no_such_module_anywhere", r["fatal"] or "")

    def test_cma_install_failure_is_fatal(self):
        # No cma package: the route cannot be installed.
        r, _ = _run_fake_route("cma", "def test_memory():\n    pass\n", 60, skip=("cma/",))
        self.assertIn("cma.torch.use_as_default() failed", r["fatal"] or "")


if __name__ == "__main__":
    unittest.main()
