"""torch_oversub_bench.py without torch or a GPU: arguments, the plan and
host-memory refusals, comparisons, summaries and the table, the blocker's
fill loop and lifetime (a fake device: it must die with its parent), a
route's process killed at its time with its partial steps kept, and the
whole run end to end with fake routes."""
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
import unittest.mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import oversub_blocker as ob  # noqa: E402
import oversub_report as rep  # noqa: E402
import torch_oversub_bench as bench  # noqa: E402

GiB, MiB = ob.GiB, ob.MiB

# A route's process as the parent sees it: INFO, STEP lines, the result.
FAKE_ROUTE = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, %r)
    import oversub_blocker as ob, torch_routes
    argv = sys.argv[1:]
    arg = lambda k: argv[argv.index(k) + 1]
    route, steps, mode = arg("--route"), int(arg("--steps")), arg("--mode")
    gpu = int(os.environ.get("OVERSUB_FAKE_GPU", 1 << 40))
    info = {"route": route, "free_after_init": gpu - (500 << 20), "reserved_after_init": 2 << 20,
            "torch": "fake", "cma_conf": os.environ.get("CMA_ALLOC_CONF")}
    print("INFO " + json.dumps(info), flush=True)
    if route == "ctx":
        torch_routes.emit(info); sys.exit(0)
    if route == "cma_oversub_hint":
        torch_routes.emit({"route": route, "status": "skipped", "reason": "no host_resident()"})
        sys.exit(0)
    avail = ob.mem_available()  # sizes that pass the host checks on any machine, but FSDP2's
    out = dict(info, param_bytes=int(avail * 0.3), max_allocated=int(avail * 0.4), status="ok")
    recs = []
    for k in range(steps):
        if route == "managed_plain" and k == 1:
            time.sleep(60)  # hangs: killed by the parent, step 0 kept
        loss = 10.0 / (k + 1) + (1e-7 if route == "cma_oversub" and k == 2 else 0.0)
        rec = {"step": k, "s": 0.5 if route == "inmem" else 1.0, "free_low": 1 << 30}
        if mode == "train":
            rec["loss"] = loss
        else:
            rec.update(new_tokens=3, tokens=[[1, 2, 3], [4, 5, 6]])
        if route == "cma_oversub":
            rec["cma_delta"] = {"prefetched_bytes_to_device": 2 << 30}
        print("STEP " + json.dumps(rec), flush=True)
        recs.append(rec)
    out["steps"] = recs
    torch_routes.emit(out)
""" % HERE)


def _load(path):
    with open(path) as f:
        return json.load(f)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class ArgsAndPlan(unittest.TestCase):
    def test_defaults_by_mode_and_quick(self):
        a = bench.parse_args([])
        self.assertEqual((a.layers, a.width, a.steps, a.warmup, a.ratio_list),
                         (20, 3072, 6, 2, [1.5, 3.0]))
        self.assertEqual(a.route_list, list(bench.TRAIN_ROUTES))
        q = bench.parse_args(["--quick", "--layers", "2"])
        self.assertEqual((q.layers, q.width, q.seq, q.route_time), (2, 512, 128, 120))
        i = bench.parse_args(["--mode", "infer"])
        self.assertEqual((i.ratio_list, i.seq, i.new_tokens), ([2.0], 0, 32))
        self.assertEqual(i.route_list, list(bench.INFER_ROUTES))
        self.assertEqual(bench.positions(i), 160)

    def test_bad_arguments(self):
        for argv in (["--routes", "inmem"], ["--routes", "nope"], ["--ratios", "0"],
                     ["--width", "100", "--heads", "3"]):
            with self.assertRaises(SystemExit), unittest.mock.patch("sys.stderr", io.StringIO()):
                bench.parse_args(argv)

    def test_route_argv_forwards_and_caps_plain(self):
        a = bench.parse_args(["--quick", "--steps", "9", "--bf16", "--plain-steps", "3"])
        argv = bench.route_argv(a, "managed_plain", 1.5)
        self.assertEqual(argv[argv.index("--steps") + 1], "3")
        self.assertEqual(argv[argv.index("--width") + 1], "512")
        self.assertIn("--bf16", argv)
        child = bench.parse_args(argv[2:])  # what the route's process parses
        self.assertEqual((child.route, child.steps, child.width, child.bf16),
                         ("managed_plain", 3, 512, True))
        argv = bench.route_argv(a, "cma_oversub")
        self.assertEqual(argv[argv.index("--steps") + 1], "9")

    def test_param_count_is_gpt2_small(self):
        self.assertEqual(rep.param_count(12, 768, 50257, 1024), 124439808)

    def test_context_plan_host(self):
        c, how = rep.context_cost(10 * GiB, {"free_after_init": 9 * GiB,
                                             "reserved_after_init": 2 * MiB}, 0, 768 * MiB)
        self.assertEqual(c, GiB - 2 * MiB)
        self.assertIn("measured", how)
        c, how = rep.context_cost(0, {}, 64 * MiB, 768 * MiB)
        self.assertEqual(c, 832 * MiB)
        self.assertIn("fallback", how)
        base = {"max_allocated": 30 * GiB, "param_bytes": 6 * GiB}
        p = rep.plan("train", base, 3, 500 * MiB)
        self.assertEqual((p["data_free"], p["blocker_free"]), (10 * GiB, 10 * GiB + 500 * MiB))
        self.assertEqual(rep.plan("infer", base, 2, 0)["data_free"], 3 * GiB)
        self.assertEqual(rep.host_need("fsdp2_offload", "train", base, 10 * GiB), 24 * GiB)
        self.assertEqual(rep.host_need("cma_oversub", "train", base, 10 * GiB), 20 * GiB)
        self.assertEqual(rep.host_need("cma_oversub", "train", base, 29 * GiB), 6 * GiB)
        self.assertEqual(rep.host_need("accel_auto", "infer", base, 3 * GiB), 6 * GiB)
        self.assertIsNone(rep.refusal(20 * GiB, 40 * GiB))
        self.assertIn("more than half of MemAvailable", rep.refusal(21 * GiB, 40 * GiB))
        self.assertEqual(rep.cma_conf("oversubscribe:1,managed_budget:{budget_gib}G",
                                      10 * GiB, 100 * GiB + 1), "oversubscribe:1,managed_budget:61G")


class Results(unittest.TestCase):
    def test_compare_losses_by_repr(self):
        self.assertEqual(rep.compare([1.0, 0.5, 0.25], [1.0, 0.5, 0.25])["identical"], True)
        c = rep.compare([1.0, 0.5, 0.25], [1.0, 0.5 + 1e-16 * 10, 0.25])
        self.assertEqual((c["identical"], c["first_diff"]), (False, 1))
        c = rep.compare([1.0, 0.5, 0.25], [1.0, 0.5])
        self.assertEqual((c["identical"], c["compared"], c["of"]), (True, 2, 3))
        self.assertEqual(rep.same_text(c), "yes (2 of 3)")
        self.assertEqual(rep.same_text(rep.compare([1.0], [2.0])), "no (first at 0)")
        self.assertFalse(rep.compare([1.0], [])["identical"])

    def test_compare_tokens_prefix(self):
        ref = [[1, 2, 3], [4, 5, 6]]
        self.assertEqual(rep.same_text(rep.compare_tokens(ref, [ref, ref])), "yes")
        self.assertEqual(rep.same_text(rep.compare_tokens(ref, [ref, [[1, 2], [4, 5]]])),
                         "yes (2 of 3)")
        self.assertEqual(rep.compare_tokens(ref, [ref, [[1, 2, 3], [4, 0, 6]]])["first_diff"], 1)

    def test_summarize_route(self):
        steps = [{"s": s, "loss": l, "free_low": f} for s, l, f in
                 [(9.0, 3.0, 5 * GiB), (1.0, 2.0, 4 * GiB), (2.0, 1.0, 6 * GiB), (4.0, 0.5, 6 * GiB)]]
        base = rep.summarize_route({"route": "inmem", "steps": steps, "free_after_init": 10 * GiB,
                                    "status": "ok"}, None, "train", 2, 1000)
        self.assertEqual((base["s_step"], base["tokens_s"]), (3.0, 375.0))
        self.assertEqual(base["dev_peak"], 6 * GiB)
        slow = [dict(s, s=s["s"] * 4, cma_delta={"prefetched_bytes_to_device": 7}) for s in steps]
        row = rep.summarize_route({"route": "cma_oversub", "steps": slow, "status": "ok"}, base,
                                  "train", 2, 1000)
        self.assertAlmostEqual(row["vs_inmem"], 0.25)
        self.assertTrue(row["same"]["identical"])
        self.assertEqual(row["moved_to_device"], 7)
        cut = rep.summarize_route({"route": "managed_plain", "steps": slow[:1]}, base, "train",
                                  2, 1000)
        self.assertTrue(cut["warmup_only"])
        self.assertEqual(rep.same_text(cut["same"]), "yes (1 of 4)")
        inf = rep.summarize_route({"route": "inmem", "steps": [
            {"s": 2.0, "new_tokens": 8, "tokens": [[1] * 8]}, {"s": 1.0, "new_tokens": 4,
                                                                "tokens": [[1] * 4]}]},
            None, "infer", 1, 2)
        self.assertEqual(inf["tokens_s"], 8.0)  # batch 2 x 4 tokens in 1 s
        fs = rep.summarize_route({"route": "fsdp2_offload", "steps": steps,
                                  "est_h2d_bytes_per_step": 3, "est_d2h_bytes_per_step": 2},
                                 base, "train", 2, 1000)
        self.assertTrue(fs["moved_estimated"])
        doc = {"args": {"mode": "train"}, "argv": ["x"], "sections": [
            {"plan": {}, "rows": [base]},
            {"plan": rep.plan("train", {"max_allocated": 30 * GiB, "param_bytes": GiB}, 3, 0),
             "rows": [row, cut, fs], "notes": ["cma_oversub_hint: skipped"]}]}
        md = rep.markdown(doc)
        self.assertIn("| cma_oversub | ok | 4 | 12.000 | 93.8 | 0.250 | yes |", md)
        self.assertIn("(warm-up only)", md)
        self.assertIn("~", md)
        self.assertIn("R = 3: X = 10.00 GiB", md)


class BlockerTest(unittest.TestCase):
    def test_fill_to(self):
        for overhead in (0, MiB, 40 * MiB):
            dev = ob._Fake(80 * GiB)
            orig = dev.alloc

            def alloc(n, orig=orig, dev=dev, overhead=overhead):
                h = orig(n)
                if h is not None:
                    dev.free -= overhead
                return h
            free, held = ob.fill_to(20 * GiB, 64 * MiB, lambda: dev.info()[0], alloc, dev.release)
            self.assertLessEqual(abs(free - 20 * GiB), 64 * MiB)
            self.assertEqual(free, dev.free)
        with self.assertRaises(RuntimeError):
            dev = ob._Fake(GiB)
            ob.fill_to(2 * GiB, 64 * MiB, lambda: dev.info()[0], dev.alloc, dev.release)

    def test_ready_and_close(self):
        b = ob.Blocker(10 * GiB, fake=30 * GiB)
        self.assertLessEqual(abs(b.free - 10 * GiB), 64 * MiB)
        self.assertGreater(b.facts["held"], 19 * GiB)
        pid = b.proc.pid
        b.close()
        b.close()
        self.assertFalse(_alive(pid))
        with self.assertRaises(RuntimeError) as e:
            ob.Blocker(40 * GiB, fake=30 * GiB)
        self.assertIn("only", str(e.exception))
        self.assertEqual(ob.Blocker(-1, fake=30 * GiB).free, 30 * GiB)

    def test_dies_with_its_parent(self):
        code = ("import sys, time; sys.path.insert(0, %r); import oversub_blocker as ob; "
                "b = ob.Blocker(1 << 30, fake=4 << 30); print(b.proc.pid, flush=True); "
                "time.sleep(60)" % HERE)
        parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        pid = int(parent.stdout.readline())
        self.assertTrue(_alive(pid))
        parent.send_signal(signal.SIGKILL)  # no atexit, no finally: the blocker must still go
        parent.wait()
        parent.stdout.close()
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(_alive(pid))

    def test_meminfo(self):
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("MemTotal:       131072000 kB\nMemAvailable:    1024 kB\nHugePages_Total: 0\n")
        self.assertEqual(ob.mem_available(f.name), 1024 * 1024)
        self.assertEqual(ob.meminfo(f.name)["HugePages_Total"], 0)
        self.assertGreater(ob.mem_available(), 0)


class EndToEnd(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.fake = os.path.join(self.dir, "fake_route.py")
        with open(self.fake, "w") as f:
            f.write(FAKE_ROUTE)
        self.env = unittest.mock.patch.dict(os.environ, {"OVERSUB_FAKE_ROUTE": self.fake,
                                                         "OVERSUB_FAKE_GPU": str(1 << 40)})
        self.env.start()
        self.addCleanup(self.env.stop)

    def test_run_route_timeout_keeps_partial_steps(self):
        a = bench.parse_args(["--quick"])
        t0 = time.monotonic()
        rec = bench.run_route(bench.route_argv(a, "managed_plain"), bench.route_env("x"),
                              timeout=2, floor=0, log=io.StringIO())
        self.assertLess(time.monotonic() - t0, 20)
        self.assertTrue(rec["status"].startswith("timed out"), rec["status"])
        self.assertEqual(len(rec["steps"]), 1)
        self.assertEqual(rec["free_after_init"], (1 << 40) - 500 * MiB)  # from the INFO line
        rec = bench.run_route([sys.executable, "-c", "import sys; sys.exit('boom')", "--route",
                               "x"], bench.route_env("x"), 10, 0, log=io.StringIO())
        self.assertEqual(rec["status"], "failed (rc 1)")
        self.assertIn("boom", rec["stderr_tail"])

    def test_main_train(self):
        out = os.path.join(self.dir, "o.json")
        with unittest.mock.patch("sys.stdout", io.StringIO()), \
                unittest.mock.patch("sys.stderr", io.StringIO()):
            rc = bench.main(["--quick", "--ratios", "1.5,3", "--json", out, "--route-time", "1",
                             "--setup-timeout", "2", "--host-floor-gib", "0"])
        self.assertEqual(rc, 1)  # managed_plain timed out
        doc = _load(out)
        self.assertEqual(doc["context_bytes"], 498 * MiB)
        secs = doc["sections"]
        self.assertEqual([s["plan"].get("ratio") for s in secs], [None, 1.5, 3.0])
        peak = doc["records"][0]["max_allocated"]
        self.assertEqual(secs[2]["plan"]["blocker_free"], int(peak / 3) + 498 * MiB)
        rows = {r["route"]: r for r in secs[1]["rows"]}
        self.assertIn("refused", rows["fsdp2_offload"]["status"])  # 4 x 0.3 x MemAvailable
        self.assertTrue(rows["managed_plain"]["status"].startswith("timed out"))
        self.assertEqual(rows["cma_oversub"]["same"]["first_diff"], 2)
        self.assertAlmostEqual(rows["cma_oversub"]["vs_inmem"], 0.5)
        self.assertEqual(rows["cma_oversub_hint"]["status"], "skipped")
        recs = [r for r in doc["records"] if r["route"] == "cma_oversub"]
        self.assertTrue(recs[0]["conf"].startswith("oversubscribe:1,managed_budget:"))
        self.assertEqual(recs[0]["cma_conf"], recs[0]["conf"])  # what the route saw
        with open(os.path.join(self.dir, "o.md")) as f:
            md = f.read()
        self.assertIn("no (first at 2)", md)
        self.assertIn("cma_oversub_hint: no host_resident()", md)
        self.assertIn("- managed_plain timed out after 3 s", md)

    def test_main_infer(self):
        out = os.path.join(self.dir, "i.json")
        with unittest.mock.patch("sys.stdout", io.StringIO()), \
                unittest.mock.patch("sys.stderr", io.StringIO()):
            rc = bench.main(["--quick", "--mode", "infer", "--routes", "cma_oversub,accel_auto",
                             "--json", out, "--host-floor-gib", "0"])
        self.assertEqual(rc, 0)
        doc = _load(out)
        rows = {r["route"]: r for r in doc["sections"][1]["rows"]}
        self.assertEqual(rep.same_text(rows["accel_auto"]["same"]), "yes")
        self.assertEqual(rows["cma_oversub"]["tokens_s"], 6.0)


if __name__ == "__main__":
    unittest.main()
