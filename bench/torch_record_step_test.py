"""torch_record_step.py without torch or a GPU: which uses an op makes (a
fake torch: tensors, storages and op schemas), the merge of the allocator's
trace with the ops by the counters, and its output read by link_limit."""
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_record_step as rec  # noqa: E402


class Tensor:
    def __init__(self, ptr, nbytes, device="cuda"):
        self.device = types.SimpleNamespace(type=device)
        self._st = types.SimpleNamespace(data_ptr=lambda: ptr, nbytes=lambda: nbytes)

    def untyped_storage(self):
        return self._st


FAKE_TORCH = types.SimpleNamespace(Tensor=Tensor)


def op(name, args, write=(), kwarg_only=()):
    """An op whose schema names `args`; those in `write` are Tensor(a!)."""
    def arg(n):
        info = types.SimpleNamespace(is_write=True) if n in write else None
        return types.SimpleNamespace(name=n, kwarg_only=n in kwarg_only, alias_info=info)
    return types.SimpleNamespace(overloadpacket=types.SimpleNamespace(__name__=name),
                                 _schema=types.SimpleNamespace(arguments=[arg(n) for n in args]))


def touches(func, args, result, kwargs=None):
    return rec.kernel_touches(FAKE_TORCH, func, args, kwargs or {}, result)


class KernelTouchesTest(unittest.TestCase):
    def test_reads_arguments_and_writes_fresh_results(self):
        a, b, out = Tensor(100, 8), Tensor(200, 8), Tensor(300, 8)
        self.assertEqual(touches(op("add", ["self", "other"]), (a, b), out),
                         [{100: [8, True, False], 200: [8, True, False], 300: [8, False, True]}])

    def test_in_place_reads_and_writes(self):
        a, b = Tensor(100, 8), Tensor(200, 8)
        self.assertEqual(touches(op("add_", ["self", "other"], write={"self"}), (a, b), a),
                         [{100: [8, True, True], 200: [8, True, False]}])

    def test_views_and_factories_run_no_kernel(self):
        a = Tensor(100, 64)
        self.assertEqual(touches(op("view", ["self", "size"]), (a, [4, 4]), Tensor(100, 64)), [])
        self.assertEqual(touches(op("empty", ["size"]), ([4],), Tensor(500, 64)), [])
        # Only CPU tensors: nothing on the device.
        self.assertEqual(touches(op("add", ["self", "other"]), (Tensor(1, 8, "cpu"),),
                                 Tensor(2, 8, "cpu")), [])

    def test_a_copy_to_the_host_reads(self):
        a = Tensor(100, 64)
        self.assertEqual(touches(op("_to_copy", ["self"]), (a,), Tensor(7, 64, "cpu")),
                         [{100: [64, True, False]}])
        self.assertEqual(touches(op("_local_scalar_dense", ["self"]), (a,), 3.0),
                         [{100: [64, True, False]}])

    def test_foreach_is_one_use_per_index(self):
        p = [Tensor(100, 8), Tensor(200, 8)]
        g = [Tensor(300, 8), Tensor(400, 8)]
        lr = Tensor(900, 4)
        got = touches(op("_foreach_add_", ["self", "other", "alpha"], write={"self"}),
                      (p, g), None, {"alpha": lr})
        self.assertEqual(got, [{100: [8, True, True], 300: [8, True, False], 900: [4, True, False]},
                               {200: [8, True, True], 400: [8, True, False], 900: [4, True, False]}])
        # Out of place: the results' list joins by index.
        outs = [Tensor(500, 8), Tensor(600, 8)]
        got = touches(op("_foreach_sqrt", ["self"]), (p,), outs)
        self.assertEqual(got, [{100: [8, True, False], 500: [8, False, True]},
                               {200: [8, True, False], 600: [8, False, True]}])


    def test_other_lists_are_one_kernel(self):
        a, b, out = Tensor(100, 8), Tensor(200, 8), Tensor(300, 16)
        self.assertEqual(touches(op("cat", ["tensors", "dim"]), ([a, b], 0), out),
                         [{100: [8, True, False], 200: [8, True, False], 300: [16, False, True]}])
        # split returns views of its argument: no kernel.
        self.assertEqual(touches(op("split_with_sizes", ["self", "split_sizes"]), (out, [1, 1]),
                                 [Tensor(300, 16), Tensor(300, 16)]), [])


class MergeTest(unittest.TestCase):
    # The step: a weight W (live); op 1 allocates A and reads W into it; A is
    # freed between ops; op 2 allocates a temporary T and its result B at A's
    # old address, frees T inside, and B stays live.
    START = [(1000, 64)]
    TRACE = [
        {"action": "alloc", "addr": 2000, "size": 32},
        {"action": "segment_alloc", "addr": 0, "size": 0},
        {"action": "free_requested", "addr": 2000, "size": 32},
        {"action": "free_completed", "addr": 2000, "size": 32},
        {"action": "alloc", "addr": 3000, "size": 16},
        {"action": "alloc", "addr": 2000, "size": 48},
        {"action": "free_requested", "addr": 3000, "size": 16},
    ]
    OPS = [
        ((10, 5), (11, 5), "op1", [{1000: [64, True, False], 2000: [32, False, True]}]),
        ((11, 6), (13, 7), "op2", [{2000: [48, False, True], 4000: [8, True, False]}]),
    ]

    def test_orders_the_trace_around_the_ops(self):
        lives, events, stats, seen = rec.merge(self.START, self.TRACE, self.OPS, (10, 5))
        self.assertEqual(seen, (13, 7))
        # 4000 is no block start: a storage of its own, live at the start.
        self.assertEqual(lives, ["live,0,64", "live,4,8"])
        self.assertEqual(events, ["alloc,1,32", "use,0:r,1:w", "free,1", "alloc,2,16",
                                  "alloc,3,48", "use,3:w,4:r", "free,2"])
        self.assertEqual(stats["unresolved_uses"], 1)
        self.assertEqual(stats["kernels"], 2)

    def test_link_limit_reads_it(self):
        tool = os.path.join(os.getcwd(), "bench", "link_limit")
        if not os.path.exists(tool):
            self.skipTest("link_limit is not in the runfiles")
        lives, events, _, _ = rec.merge(self.START, self.TRACE, self.OPS, (10, 5))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "s.csv")
            with open(path, "w") as f:
                f.write("cma_step v1\n# in_memory_s=0.5\n" + "\n".join(lives + events) + "\n")
            out = os.path.join(d, "o.json")
            r = subprocess.run([tool, "--step=" + path, "--device_bytes=200,96",
                                "--h2d_gbps=1e-6", "--d2h_gbps=1e-6", "--json=" + out],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            j = json.load(open(out))
        self.assertEqual(j["live_peak_bytes"], 64 + 8 + 16 + 48)  # W, the storage, T and B
        self.assertEqual(j["in_memory_s"], 0.5)
        # 96 bytes hold op 1 (W and A: nothing else) and op 2 (B and the
        # storage) but not W beside op 2: W and the storage, read only,
        # leave for nothing and come back each step. The bound takes the
        # bytes short at each op, 8 at op 1 and 56 + 64 - 96 = 24 at op 2,
        # over a window of 32 steps that leaves out the last op 2's.
        self.assertEqual([p["schedule"]["h2d_bytes"] for p in j["parts"]], [0, 72])
        self.assertEqual([p["schedule"]["d2h_bytes"] for p in j["parts"]], [0, 0])
        self.assertAlmostEqual(j["parts"][1]["lower_bound"]["h2d_bytes"], (32 * 32 - 24) / 32)


if __name__ == "__main__":
    unittest.main()
