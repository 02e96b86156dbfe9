"""torch_dist_bench.py's pure parts, no torch or GPU: NCCL-tests' bus
bandwidth, sizes, the loss comparison, a job's rows and the tables, each
job's command and environment (no NVLS, no multicast), the job runner's
result lines and timeout, and the parent end to end on fake workers
(item 3's blockers on a fake device)."""
import json
import os
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_dist_bench as tdb  # noqa: E402
import torch_dist_report as rep  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30

# A fake torchrun: two ranks' result lines from the route (losses differ
# from native's at step 3 under "cma" when FAKE_DIFF is set), its env echoed.
FAKE = textwrap.dedent("""
    import json, os, sys
    argv = sys.argv
    route, mode, model = (argv[argv.index(k) + 1] for k in ("--routes", "--mode", "--model"))
    if route == "expandable" and os.environ.get("FAKE_FAIL"):
        sys.exit("expandable broke")
    base = {"native": 1.0, "expandable": 1.1, "cma": 1.2, "cma_oversub": 3.0,
            "fsdp2_cpu_offload": 5.0}[route]
    losses = [float(10 - k).hex() for k in range(6)]
    if route == "cma" and os.environ.get("FAKE_DIFF"):
        losses[3] = float(7.5).hex()
    for rank in range(2):
        out = {"rank": rank, "warmup": 2, "step_s": [9, 9, base, base, base, base],
               "loss_hex": losses, "peak_sampled_MiB": 1000 * base + rank,
               "max_reserved_MiB": 900.0, "params": 123,
               "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "CMA_DISABLE_MULTICAST",
                        "CMA_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")},
               "collectives": [{"op": "all_reduce", "bytes": 1 << 20,
                                "busbw_GBps": 100.0 * base}]}
        print("noise")
        print("BENCH_RESULT " + json.dumps(out), flush=True)
""")


class FormulasTest(unittest.TestCase):
    def test_bus_bandwidth_as_nccl_tests(self):
        self.assertAlmostEqual(rep.bus_bw("all_reduce", 1e9, 1.0, 2), 1.0)
        self.assertAlmostEqual(rep.bus_bw("all_reduce", 1e9, 0.5, 8), 3.5)
        self.assertAlmostEqual(rep.bus_bw("reduce_scatter", 1e9, 1.0, 2), 0.5)
        self.assertAlmostEqual(rep.bus_bw("all_gather", 4e9, 2.0, 4), 1.5)
        self.assertIsNone(rep.bus_bw("all_reduce", 1e9, 0.0, 2))
        with self.assertRaises(ValueError):
            rep.bus_bw("broadcast", 1, 1, 2)

    def test_sizes(self):
        s = rep.coll_sizes(1, 1024, 4)
        self.assertEqual(s, [MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, GiB])
        self.assertEqual(len(rep.coll_sizes(1, 1024, 2)), 11)

    def test_losses_compared_bit_for_bit(self):
        a = [float(x).hex() for x in (3.0, 2.5, 2.25)]
        self.assertEqual(rep.compare_losses(a, list(a)), {"identical": True, "first_diff": None})
        b = list(a)
        b[1] = float(2.5 + 2 ** -40).hex()  # a last-bit difference counts
        self.assertEqual(rep.compare_losses(a, b), {"identical": False, "first_diff": 1})
        self.assertEqual(rep.compare_losses(a, a[:2])["first_diff"], 2)
        self.assertFalse(rep.compare_losses(a, [])["identical"])


def _job(route, step, peaks, losses, mode="ddp", status="ok"):
    res = [{"rank": r, "warmup": 1, "step_s": [9.0] + step, "loss_hex": losses,
            "peak_sampled_MiB": p, "max_reserved_MiB": 10.0 * r} for r, p in enumerate(peaks)]
    return {"route": route, "mode": mode, "model": "gpt2", "status": status, "world": 2,
            "results": res}


class ReportTest(unittest.TestCase):
    def test_rows_ratios_and_table(self):
        same = [float(x).hex() for x in (4.0, 3.0, 2.0)]
        diff = same[:2] + [float(2.5).hex()]
        rows = [rep.summarize_train(j) for j in (
            _job("native", [1.0, 2.0, 3.0], [100, 120], same),
            _job("expandable", [2.0, 2.0, 2.0], [200, 100], same),
            _job("cma", [3.0, 4.0, 5.0], [100, 150], diff))]
        rep.compare_rows(rows)
        nat, exp, cma = rows
        self.assertEqual(nat["step_s"], 2.0)  # the warm-up step left out
        self.assertEqual(cma["peak_MiB"], 150)  # the max over ranks
        self.assertEqual(cma["peak_MiB_per_rank"], [100, 150])
        self.assertAlmostEqual(cma["step_vs_native"], 2.0)
        self.assertAlmostEqual(cma["peak_vs_expandable"], 0.75)
        self.assertTrue(exp["same_losses"]["identical"])
        self.assertEqual(cma["same_losses"]["first_diff"], 2)
        text = rep.train_table(rows)
        self.assertIn("| gpt2 | ddp | cma | 4.0000 | 2.000 | 150 | 0.750 | - | - |", text)
        self.assertIn("no (step 2)", text)
        self.assertIn("(base)", text)

    def test_the_jobs_gpu_peak_sampled_from_before_it_started(self):
        jobs = [_job("expandable", [1.0, 1.0], [100, 100], []),
                _job("cma", [1.0, 1.0], [100, 100], [])]
        jobs[0]["gpu_peak_MiB"] = [400.0, 380.0]
        jobs[1]["gpu_peak_MiB"] = [500.0, None]  # one GPU's sampler failed
        rows = rep.compare_rows([rep.summarize_train(j) for j in jobs])
        self.assertEqual(rows[1]["gpu_peak_MiB"], 500.0)
        self.assertAlmostEqual(rows[1]["gpu_peak_vs_expandable"], 1.25)
        self.assertIn("| 500 | 1.250 |", rep.train_table(rows))

    def test_missing_rank_and_failed_job(self):
        row = rep.summarize_train(_job("cma", [1.0], [5], []))
        self.assertEqual(row["status"], "only 1 of 2 ranks reported")
        row = rep.summarize_train({"route": "cma", "mode": "ddp", "model": "gpt2",
                                   "status": "failed (rc 1)", "results": []})
        self.assertIsNone(row["step_s"])
        rep.compare_rows([row])
        self.assertIn("| - |", rep.train_table([row]))

    def test_collectives_table(self):
        coll = {"native": {"all_reduce/%d" % MiB: 100.0, "all_reduce/%d" % GiB: 300.0},
                "cma": {"all_reduce/%d" % MiB: 50.0, "all_reduce/%d" % GiB: 300.0}}
        text = rep.coll_table(coll, ["native", "cma"])
        self.assertIn("| all_reduce | 1 MiB | 100.0 | 50.0 | 0.500 |", text)
        self.assertIn("| all_reduce | 1 GiB | 300.0 | 300.0 | 1.000 |", text)
        job = {"results": [{"rank": 1, "collectives": []}, {"rank": 0, "collectives": [
            {"op": "all_gather", "bytes": 4, "busbw_GBps": 1.5}]}]}
        self.assertEqual(rep.summarize_coll(job), {"all_gather/4": 1.5})


class CommandTest(unittest.TestCase):
    def test_env_per_route(self):
        base = {"PYTORCH_CUDA_ALLOC_CONF": "x", "PATH": "/bin"}
        for route in ("native", "expandable", "cma", "cma_oversub", "fsdp2_cpu_offload"):
            env = tdb.job_env(route, 2, base=base)
            self.assertEqual(env["NCCL_NVLS_ENABLE"], "0", route)
            self.assertEqual(env["CMA_DISABLE_MULTICAST"], "1", route)
            self.assertEqual(env["CUBLAS_WORKSPACE_CONFIG"], ":4096:8", route)
            self.assertEqual(env["PATH"], "/bin")
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", tdb.job_env("native", base=base))
        self.assertNotIn("PYTORCH_CUDA_ALLOC_CONF", tdb.job_env("fsdp2_cpu_offload", base=base))
        self.assertNotIn("CMA_ALLOC_CONF", tdb.job_env("fsdp2_cpu_offload", base=base))
        self.assertEqual(tdb.job_env("expandable", base=base)["PYTORCH_CUDA_ALLOC_CONF"],
                         "expandable_segments:True")
        self.assertIn("CMA_ALLOC_CONF", tdb.job_env("cma", base={}))
        env = tdb.job_env("cma_oversub", conf="oversubscribe:1", base={"CMA_ALLOC_CONF": "y"})
        self.assertEqual(env["CMA_ALLOC_CONF"], "oversubscribe:1")
        # the user's own NCCL_NVLS_ENABLE=1 does not survive
        env = tdb.job_env("cma", base={"NCCL_NVLS_ENABLE": "1"})
        self.assertEqual(env["NCCL_NVLS_ENABLE"], "0")

    def test_argv_runs_this_file_under_torchrun_as_a_worker(self):
        a = tdb.parse_args(["--layers", "3", "--width", "64", "--heads", "4", "--adamw", "foreach"])
        argv = tdb.job_argv(a, "cma", "fsdp2", "llama", collectives=True)
        self.assertEqual(argv[1:6], ["-m", "torch.distributed.run", "--standalone",
                                     "--nproc_per_node", "2"])
        self.assertEqual(argv[6], os.path.join(HERE, "torch_dist_bench.py"))
        w = tdb.parse_args(argv[7:])  # what the worker parses
        self.assertTrue(w.worker and w.collectives)
        self.assertEqual((w.routes, w.mode, w.model), ("cma", "fsdp2", "llama"))
        self.assertEqual((w.layers, w.width, w.heads, w.adamw), (3, 64, 4, "foreach"))

    def test_bad_args_refused(self):
        for bad in (["--routes", "nope"], ["--mode", "zero3"], ["--width", "100", "--heads", "3"]):
            with self.assertRaises(SystemExit), mock.patch("sys.stderr"):
                tdb.parse_args(bad)

    def test_item3_routes_on_fsdp2_after_the_base_routes(self):
        routes = ["cma_oversub", "native", "fsdp2_cpu_offload", "cma"]
        self.assertEqual(tdb._order(routes, "ddp"), ["native", "cma"])
        self.assertEqual(tdb._order(routes, "fsdp2"),
                         ["native", "cma", "cma_oversub", "fsdp2_cpu_offload"])

    def test_oversub_plan(self):
        a = tdb.parse_args(["--ratio", "2", "--ctx-mib", "100"])
        p = tdb.oversub_plan(a, 10 * GiB, 40 * GiB)
        self.assertEqual(p["data_free"], 5 * GiB)
        self.assertEqual(p["blocker_free"], 5 * GiB + 100 * MiB)
        # budget: 5 GiB on the device + half of each rank's half of MemAvailable
        self.assertEqual(p["conf"], "oversubscribe:1,device_headroom:512M,managed_budget:15G")


class RunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.fake = os.path.join(self.tmp.name, "fake.py")
        with open(self.fake, "w") as f:
            f.write(FAKE)

    def tearDown(self):
        self.tmp.cleanup()

    def fake_argv(self, a, route, mode, model, collectives=False):
        return [sys.executable, self.fake, "--routes", route, "--mode", mode, "--model", model]

    def test_result_lines_with_torchrun_prefixes(self):
        out = 'x\n[rank1]:BENCH_RESULT {"rank": 1}\nBENCH_RESULT {"rank": 0}\n'
        self.assertEqual(tdb.parse_results(out), [{"rank": 1}, {"rank": 0}])

    def test_run_job_results_and_timeout(self):
        log = open(os.devnull, "w")
        self.addCleanup(log.close)
        j = tdb.run_job(self.fake_argv(None, "cma", "ddp", "gpt2"), tdb.job_env("cma"), 60,
                        log=log)
        self.assertEqual(j["status"], "ok")
        self.assertEqual([r["rank"] for r in j["results"]], [0, 1])
        self.assertEqual(j["results"][0]["env"]["NCCL_NVLS_ENABLE"], "0")
        argv = [sys.executable, "-c", "import time; time.sleep(60)", "--routes", "x"]
        j = tdb.run_job(argv, dict(os.environ), 1, log=log)
        self.assertTrue(j["status"].startswith("failed (rc timeout"), j["status"])
        self.assertLess(j["wall_s"], 30)

    def run_parent(self, args, env=None):
        out = os.path.join(self.tmp.name, "r.json")
        with mock.patch.object(tdb, "job_argv", self.fake_argv), \
                mock.patch.object(tdb.torch_routes, "prepare_routes", lambda *a: {}), \
                mock.patch.dict(os.environ, env or {}), mock.patch("sys.stdout"), \
                mock.patch("sys.stderr"):
            rc = tdb.main(args + ["--json", out, "--log-dir", os.path.join(self.tmp.name, "logs")])
        with open(out) as f:
            doc = json.load(f)
        with open(os.path.join(self.tmp.name, "r.md")) as f:
            return rc, doc, f.read()

    def test_parent_training_table(self):
        rc, doc, md = self.run_parent(["--routes", "native,expandable,cma", "--mode", "ddp",
                                       "--model", "gpt2,llama"], {"FAKE_DIFF": "1"})
        self.assertEqual(rc, 0)
        self.assertEqual(len(doc["rows"]), 6)
        cma = [r for r in doc["rows"] if r["route"] == "cma"][0]
        self.assertEqual(cma["same_losses"], {"identical": False, "first_diff": 3})
        self.assertAlmostEqual(cma["step_vs_native"], 1.2)
        self.assertEqual(cma["peak_MiB"], 1201)
        self.assertIn("| llama | ddp | expandable |", md)
        self.assertEqual(len(os.listdir(os.path.join(self.tmp.name, "logs"))), 6)

    def test_parent_failure_recorded_and_the_rest_run(self):
        rc, doc, md = self.run_parent(["--routes", "native,expandable,cma", "--mode", "fsdp2",
                                       "--model", "gpt2"], {"FAKE_FAIL": "1"})
        self.assertEqual(rc, 1)
        self.assertEqual([r["status"] for r in doc["rows"]],
                         ["ok", "failed (rc 1)", "ok"])
        self.assertIn("expandable broke", md)

    def test_parent_item3_with_blockers(self):
        # a fake 40 GiB device: the blockers need no GPU
        rc, doc, md = self.run_parent(
            ["--routes", "native,cma_oversub,fsdp2_cpu_offload", "--mode", "ddp,fsdp2",
             "--model", "gpt2", "--ratio", "2"], {"OVERSUB_FAKE_GPU": str(40 * GiB)})
        self.assertEqual(rc, 0, md)
        self.assertEqual([(r["mode"], r["route"]) for r in doc["rows"]],
                         [("ddp", "native"), ("fsdp2", "native"), ("fsdp2", "cma_oversub"),
                          ("fsdp2", "fsdp2_cpu_offload")])
        jobs = {j["route"]: j for j in doc["jobs"] if j["mode"] == "fsdp2"}
        plan = jobs["cma_oversub"]["plan"]
        self.assertEqual(plan["peak_bytes"], 1001 * MiB)  # native fsdp2's max over ranks
        self.assertEqual(len(plan["left_free"]), 2)
        env = jobs["cma_oversub"]["results"][0]["env"]
        self.assertTrue(env["CMA_ALLOC_CONF"].startswith("oversubscribe:1,device_headroom:512M"))
        self.assertIsNone(jobs["fsdp2_cpu_offload"]["results"][0]["env"]["CMA_ALLOC_CONF"])

    def test_parent_item3_without_a_peak_is_skipped(self):
        rc, doc, md = self.run_parent(["--routes", "cma_oversub", "--mode", "fsdp2",
                                       "--model", "gpt2"])
        self.assertEqual(doc["rows"], [])
        self.assertIn("no in-memory peak", md)

    def test_parent_collectives(self):
        rc, doc, md = self.run_parent(["--collectives", "--routes", "native,cma"])
        self.assertEqual(rc, 0)
        self.assertEqual(doc["coll"]["cma"], {"all_reduce/%d" % MiB: 120.0})
        self.assertIn("| all_reduce | 1 MiB | 100.0 | 120.0 | 1.200 |", md)


if __name__ == "__main__":
    unittest.main()
