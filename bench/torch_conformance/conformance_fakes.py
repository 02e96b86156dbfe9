"""The fakes conformance_test.py runs the harness on: a child process that
speaks the event-log protocol (FAKE_CHILD), a fake torch and cma (FAKE_TORCH)
and a test_cuda.py for the real plugin (FAKE_TEST_FILE, with the outcomes
it must give, FAKE_EXPECT). Data only: kept apart so the tests stay
readable."""
import textwrap

FAKE_CHILD = textwrap.dedent("""
    import fcntl, json, os, sys, time
    sys.path.insert(0, os.environ["HARNESS_DIR"])
    import conformance_core as core
    lock = None
    if os.environ.get("FAKE_LOCK"):
        # Held shared for the child's life: a process on the GPU.
        lock = open(os.environ["FAKE_LOCK"], "a")
        fcntl.flock(lock, fcntl.LOCK_SH)
    time.sleep(float(os.environ.get("FAKE_START_S", "0")))   # importing torch
    ids = ["f.py::T::test_graph_a", "f.py::T::test_memory_crash", "f.py::T::test_streams",
           "f.py::T::test_graph_hang", "f.py::T::test_snapshot_b", "f.py::T::test_mempool_slow"]
    if os.environ.get("FAKE_DEVICE_WIDE"):
        ids.insert(1, "f.py::T::test_memory_device_wide")

    def alone_on_the_gpu():
        # Like a test comparing cudaMemGetInfo before and after: wrong when
        # another child holds the lock at any time during 1 s.
        fcntl.flock(lock, fcntl.LOCK_UN)
        end = time.time() + 1.0
        while time.time() < end:
            with open(os.environ["FAKE_LOCK"], "a") as probe:
                try:
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return False
            time.sleep(0.05)
        return True
    only = None
    if os.environ.get("CMA_CONF_ONLY"):
        only = json.load(open(os.environ["CMA_CONF_ONLY"]))
    keep = core.select(ids, keywords=core.selection_keywords(), only=only)
    ev = core.EventWriter(os.environ["CMA_CONF_EVENTS"])
    selected, keep = keep, core.first_chunk(keep)
    if os.environ.get("FAKE_FATAL"):
        ev.write("fatal", msg="route install failed")
        sys.exit(4)
    ev.write("selected", ids=selected, collected=len(ids))
    ev.write("meta", torch="fake", route=os.environ["CMA_CONF_ROUTE"],
             selection=core.selection_name(core.selection_keywords()))
    for i in keep:
        ev.start(i)
        if "device_wide" in i:
            ok = alone_on_the_gpu()
            ev.end(i, "passed" if ok else "failed",
                   "" if ok else "AssertionError: device memory changed by another process", 0.0)
            continue
        if "crash" in i:
            print("terminate called: fake allocator abort", flush=True)
            os.abort()
        if "hang" in i:
            time.sleep(1000)   # no faulthandler here: the driver must kill it
        if "slow" in i:
            time.sleep(float(os.environ.get("FAKE_SLOW_S", "0")))
        if i.endswith("graph_a"):
            time.sleep(float(os.environ.get("FAKE_A_S", "0")))
        ev.end(i, "passed", "", 0.0)
    """)


FAKE_TORCH = {
    "torch/__init__.py": """
        __version__ = "0.0+fake"
        uint8 = "uint8"
        class version:
            cuda = "13.0"
        from . import cuda
        class _Storage:
            def data_ptr(self):
                return 4096
        class _Tensor:
            def untyped_storage(self):
                return _Storage()
        def empty(*a, **k):
            cuda.init()
            return _Tensor()
        """,
    "torch/cuda.py": """
        _initialized = False
        route = "native"
        def is_initialized():
            return _initialized
        def init():
            global _initialized
            _initialized = True
        def get_device_name(i=0):
            return "FakeGPU"
        def get_allocator_backend():
            return route
        def empty_cache():
            pass
        broken = False
        def synchronize():
            if broken:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
        """,
    "torch/testing/__init__.py": "",
    "torch/testing/_internal/__init__.py": "",
    "torch/testing/_internal/common_utils.py": """
        import unittest
        import expecttest
        class TestCase(expecttest.TestCase):
            pass
        TEST_CUDA = True
        """,
    "cma/__init__.py": "",
    "cma/torch.py": """
        import torch
        def use_as_default():
            if torch.cuda.is_initialized():
                raise RuntimeError("too late")
            torch.cuda.route = "cma"
        """,
    "cma/_lib.py": """
        import torch
        def device_of(ptr):
            return 0 if torch.cuda.route == "cma" else None
        """,
}

FAKE_TEST_FILE = """
import os
import signal
import time
import unittest

import torch
from torch.testing._internal.common_utils import TestCase, TEST_CUDA, TEST_BRAND_NEW, brandNewDecorator

torch.cuda.init()   # like test_cuda.py, which reads device properties at import


class TestFake(TestCase):
    def test_memory_route_installed_before_import(self):
        self.assertEqual(torch.cuda.route, os.environ["CMA_CONF_ROUTE"])

    def test_graph_fails(self):
        raise RuntimeError("graph capture refused")

    def test_snapshot_skips(self):
        self.skipTest("no snapshot here")

    @unittest.expectedFailure
    def test_mempool_expected_failure(self):
        self.assertTrue(False)

    def test_out_of_memory_kills_the_process(self):
        os.abort()

    def test_caching_allocator_overruns(self):
        time.sleep(30)

    def test_mem_pool_stuck_where_sigalrm_cannot_reach(self):
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
        time.sleep(30)

    @brandNewDecorator("needs a newer torch")
    def test_memory_uses_a_missing_decorator(self):
        pass

    def test_memory_expect_inline(self):
        self.assertExpectedInline("a\\nb", '''\\
a
b''')

    def test_graph_breaks_the_context(self):
        torch.cuda.broken = True
        raise RuntimeError("illegal memory access")

    def test_graph_runs_in_a_fresh_context(self):
        self.assertFalse(torch.cuda.broken)

    def test_memory_excluded(self):
        os.abort()

    def test_streams_is_not_selected(self):
        pass


class TestMemPoolByClassName(TestCase):
    def test_anything(self):
        pass
"""


FAKE_EXPECT = {
    "test_memory_route_installed_before_import": "passed",
    "test_graph_fails": "failed",
    "test_snapshot_skips": "skipped",
    "test_mempool_expected_failure": "xfailed",
    "test_out_of_memory_kills_the_process": "crashed",
    "test_caching_allocator_overruns": "timeout",
    "test_mem_pool_stuck_where_sigalrm_cannot_reach": "timeout",
    "test_memory_uses_a_missing_decorator": "skipped",
    "test_memory_expect_inline": "passed",
    "test_anything": "passed",
    "test_graph_breaks_the_context": "failed",
    "test_graph_runs_in_a_fresh_context": "passed",
    "test_memory_excluded": "not_run",
}
