"""torch_routes.py with fake routes (no torch, no GPU): rotation, one fresh
process per route and round with the route's environment, failures and
timeouts recorded while the rest go on, the time budget, medians and ratios,
the equality check, and the peak sampler's protocol on a fake NVML."""
import io
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_routes  # noqa: E402

# A fake route process: its figures come from the route and the round; it
# reports the environment it got.
FAKE = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, %r)
    import torch_routes
    route, k, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if mode == "fail" and route == "cma":
        sys.exit("cma refused")
    if mode == "hang" and route == "cma":
        time.sleep(30)
    if mode == "sleep":
        time.sleep(0.4)
    base = {"native": 100.0, "expandable": 80.0, "cma": 60.0}[route]
    print("noise on stdout")
    torch_routes.emit({"route": route, "metrics": {"t": base + k, "only_native": 1.0
                       if route == "native" else None},
                       "check": [1, 2, 3] if not (mode == "differ" and route == "cma") else [9],
                       "problems": ["slow"] if mode == "problem" and route == "expandable" else [],
                       "conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                       "cma_conf": os.environ.get("CMA_ALLOC_CONF", "")})
""" % HERE)


class RoutesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.fake = os.path.join(self.dir, "fake.py")
        with open(self.fake, "w") as f:
            f.write(FAKE)
        self.log = io.StringIO()

    def run_fake(self, mode, rounds=3, timeout=20, budget=0, routes=torch_routes.ROUTES):
        return torch_routes.run_rounds(
            lambda route, k: [sys.executable, self.fake, route, str(k), mode], list(routes),
            rounds, timeout, budget, log=self.log)

    def test_rotation(self):
        self.assertEqual(torch_routes.rotated(["a", "b", "c"], 0), ["a", "b", "c"])
        self.assertEqual(torch_routes.rotated(["a", "b", "c"], 1), ["b", "c", "a"])
        self.assertEqual(torch_routes.rotated(["a", "b", "c"], 5), ["c", "a", "b"])

    def test_rounds_medians_ratios_env(self):
        run = self.run_fake("ok")
        self.assertEqual(run["order"], [[0, "native"], [0, "expandable"], [0, "cma"],
                                        [1, "expandable"], [1, "cma"], [1, "native"],
                                        [2, "cma"], [2, "native"], [2, "expandable"]])
        res = run["results"]
        self.assertEqual([r["conf"] for r in res["expandable"]], ["expandable_segments:True"] * 3)
        self.assertEqual({r["conf"] for r in res["native"] + res["cma"]}, {""})
        self.assertEqual({r["cma_conf"] for r in res["cma"]}, {"managed_budget:16G"})
        s = torch_routes.summarize(run, list(torch_routes.ROUTES), [("t", "ms"),
                                                                    ("only_native", "x")])
        self.assertTrue(s["ok"], s["problems"])
        t = s["metrics"]["t"]
        self.assertEqual(t["per_round"]["cma"], [60.0, 61.0, 62.0])
        self.assertEqual(t["median"], {"native": 101.0, "expandable": 81.0, "cma": 61.0})
        self.assertAlmostEqual(t["ratio"]["cma/native"], 61 / 101)
        self.assertAlmostEqual(t["ratio"]["cma/expandable"], 61 / 81)
        self.assertAlmostEqual(t["ratio"]["expandable/native"], 81 / 101)
        self.assertNotIn("native/expandable", t["ratio"])
        self.assertEqual(s["metrics"]["only_native"]["median"]["cma"], None)
        text = torch_routes.table(s, list(torch_routes.ROUTES))
        self.assertIn("cma/expandable", text)
        self.assertIn("0.753", text)  # 61/81
        self.assertIn("verdict: OK", text)

    def test_failure_is_recorded_and_others_go_on(self):
        run = self.run_fake("fail", rounds=2)
        self.assertEqual(len(run["results"]["native"]), 2)
        self.assertEqual(len(run["failures"]["cma"]), 2)
        self.assertIn("cma refused", run["failures"]["cma"][0]["stderr_tail"])
        s = torch_routes.summarize(run, list(torch_routes.ROUTES), [("t", "ms")])
        self.assertFalse(s["ok"])
        self.assertIn("route cma: no successful round", s["problems"])
        self.assertNotIn("cma/native", s["metrics"]["t"]["ratio"])
        self.assertIn("verdict: PROBLEMS", torch_routes.table(s, list(torch_routes.ROUTES)))

    def test_timeout(self):
        t0 = time.monotonic()
        run = self.run_fake("hang", rounds=1, timeout=3)
        self.assertLess(time.monotonic() - t0, 20)
        self.assertIn("timeout", str(run["failures"]["cma"][0]["rc"]))
        self.assertEqual(len(run["results"]["native"]), 1)

    def test_budget_skips_processes(self):
        run = self.run_fake("sleep", rounds=10, budget=2.0)
        self.assertTrue(run["skipped"])
        self.assertLess(run["wall_s"], 4.0)
        done = sum(len(v) for v in run["results"].values())
        self.assertEqual(done + len(run["skipped"]), 30)

    def test_budget_counts_from_started(self):
        run = torch_routes.run_rounds(
            lambda route, k: [sys.executable, self.fake, route, str(k), "ok"], ["native"], 2,
            20, budget_s=5, log=self.log, started=time.monotonic() - 10)
        self.assertEqual(run["order"], [])
        self.assertEqual(run["skipped"], [[0, "native"], [1, "native"]])
        self.assertGreaterEqual(torch_routes.remaining(1, 100), 5.0)
        self.assertEqual(torch_routes.remaining(0, 100), 100)

    def test_check_and_problems(self):
        s = torch_routes.summarize(self.run_fake("differ", rounds=1), list(torch_routes.ROUTES),
                                   [("t", "ms")])
        self.assertFalse(s["check_identical"])
        self.assertTrue(any("differ" in p and "cma round 0" in p for p in s["problems"]))
        s = torch_routes.summarize(self.run_fake("problem", rounds=1), list(torch_routes.ROUTES),
                                   [("t", "ms")])
        self.assertTrue(s["check_identical"])
        self.assertEqual(s["problems"], ["route expandable round 0: slow"])

    def test_finish_writes_json_and_table(self):
        run = self.run_fake("ok", rounds=1)
        path = os.path.join(self.dir, "out.json")

        class Args:
            rounds = 1
        saved = sys.stdout
        sys.stdout = io.StringIO()
        try:
            rc = torch_routes.finish("fake", Args(), run, list(torch_routes.ROUTES), [("t", "ms")],
                                     path)
        finally:
            sys.stdout = saved
        self.assertEqual(rc, 0)
        with open(path) as f:
            doc = json.load(f)
        self.assertEqual(doc["summary"]["metrics"]["t"]["median"]["cma"], 60.0)
        with open(os.path.join(self.dir, "out.txt")) as f:
            self.assertIn("verdict: OK", f.read())

    def test_sampler_protocol_on_fake_nvml(self):
        values = os.path.join(self.dir, "free.txt")
        with open(values, "w") as f:
            f.write("1000 900 400 700\n")
        s = torch_routes.PeakSampler(fake=values)
        self.assertIsNone(s.error)
        s.start()
        time.sleep(0.2)
        r = s.stop()
        self.assertEqual((r["base_free"], r["min_free"], r["peak"]), (1000, 400, 600))
        self.assertGreater(r["samples"], 10)
        self.assertLess(r["mean_interval_ms"], 20)

    def test_sampler_error_is_reported(self):
        s = torch_routes.PeakSampler(fake=os.path.join(self.dir, "missing.txt"))
        s.start()
        self.assertIn("error", s.stop())

    def test_real_nvml_absent_or_working(self):
        # Here (no GPU) NVML is absent: a clear error; on a GPU machine, a peak.
        s = torch_routes.PeakSampler()
        s.start()
        r = s.stop()
        if "error" in r:
            self.assertIn("libnvidia-ml", r["error"])
        else:
            self.assertGreaterEqual(r["peak"], 0)


if __name__ == "__main__":
    unittest.main()
