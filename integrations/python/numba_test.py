"""cma.numba on the host backend (no GPU): the EMM plugin's allocation, frees
under defer_cleanup, memory info, refused IPC and reset, driven through
Debian's Numba with a stand-in context (Numba makes a real one only with a
GPU; integrations/python/gpu/numba_gpu_test.py runs the kernels). Also: the
module imports without Numba and then names Numba when used."""
import gc
import os
import subprocess
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cma  # noqa: E402
import cma.numba  # noqa: E402


def _address(memory_pointer):
    p = memory_pointer.device_pointer  # a ctypes integer or a cuda-python CUdeviceptr
    return p.value if hasattr(p, "value") else int(p)


@pytest.fixture(autouse=True)
def host_allocator():
    cma.init("", backend="host")
    yield
    gc.collect()
    cma.shutdown()


@pytest.fixture
def manager():
    context = types.SimpleNamespace(device=types.SimpleNamespace(id=0))
    m = cma.numba.CmaNumbaManager(context=context)
    m.initialize()
    return m


def current_allocations():
    return cma.stats(0)["allocation.all.current"]


def test_memalloc_is_cma_memory_freed_when_numba_drops_it(manager):
    assert manager.interface_version == 1
    mp = manager.memalloc(1000)
    assert mp.size == 1000
    assert cma.device_of(_address(mp)) == 0
    assert current_allocations() == 1
    del mp
    gc.collect()
    assert current_allocations() == 0


def test_zero_bytes_is_a_null_pointer_and_no_allocation(manager):
    mp = manager.memalloc(0)
    assert _address(mp) == 0 and mp.size == 0
    assert current_allocations() == 0


def test_defer_cleanup_holds_frees_until_the_outermost_context_ends(manager):
    a = manager.memalloc(1 << 20)
    a_address = _address(a)
    with manager.defer_cleanup():
        with manager.defer_cleanup():
            del a
            gc.collect()
            assert manager.pending_frees() == 1
            # Not freed: the same size cannot be handed the same block.
            b = manager.memalloc(1 << 20)
            assert _address(b) != a_address
            assert current_allocations() == 2
        assert manager.pending_frees() == 1  # the outer context still holds it
        assert current_allocations() == 2
    assert manager.pending_frees() == 0
    assert current_allocations() == 1
    c = manager.memalloc(1 << 20)  # now the freed block serves again
    assert _address(c) == a_address
    del b, c


def test_memory_info_follows_the_budget_and_allocations(manager):
    first = manager.memalloc(1 << 20)  # the device's budget is planned at its first use
    budget = cma.stats(0)["managed_budget_bytes"]
    before = manager.get_memory_info()
    assert before.total == budget > 0
    assert 0 < before.free <= budget
    mp = manager.memalloc(8 << 20)
    after = manager.get_memory_info()
    assert after.total == budget
    assert after.free == before.free - (8 << 20)
    del mp, first


def test_out_of_memory_is_a_memory_error_with_cmas_message(manager):
    cma.set_memory_fraction(0.001, 0)
    with pytest.raises(MemoryError, match="managed budget") as e:
        manager.memalloc(64 << 20)
    assert isinstance(e.value, cma.CmaOutOfMemoryError)
    with pytest.raises(cma.CmaError) as e:  # not out of memory: no MemoryError
        cma.malloc(0)
    assert not isinstance(e.value, MemoryError)


def test_ipc_handle_is_refused_clearly(manager):
    mp = manager.memalloc(4096)
    with pytest.raises(RuntimeError, match="managed memory.*cannot export"):
        manager.get_ipc_handle(mp)
    del mp


def test_reset_frees_what_is_held_and_a_late_finalizer_does_nothing(manager):
    kept = manager.memalloc(3 << 20)
    with manager.defer_cleanup():
        dropped = manager.memalloc(1 << 20)
        del dropped
        gc.collect()
        assert current_allocations() == 2
        manager.reset()
        assert current_allocations() == 0
        assert manager.pending_frees() == 0
    assert cma.stats(0)["reserved_bytes.all.current"] == 0  # idle cache given back
    kept._finalizer()  # Numba dropping it later: no double free
    assert current_allocations() == 0


def test_numba_accepts_the_plugin():
    from numba import cuda
    assert cma.numba._numba_memory_manager is cma.numba.CmaNumbaManager
    assert issubclass(cma.numba.CmaNumbaManager, cuda.HostOnlyCUDAMemoryManager)
    cma.numba.use()  # Numba instantiates it and checks interface_version
    from numba.cuda.cudadrv import driver
    assert driver._memory_manager is cma.numba.CmaNumbaManager


def test_imports_without_numba_and_names_numba_when_used():
    # A fresh interpreter in which `import numba` fails, as where it is not installed.
    code = """
import sys
class NoNumba:
    def find_spec(self, name, path=None, target=None):
        if name == "numba" or name.startswith("numba."):
            raise ImportError("No module named 'numba'", name="numba")
sys.meta_path.insert(0, NoNumba())
import cma.numba
for use in (cma.numba.use, lambda: cma.numba.CmaNumbaManager):
    try:
        use()
    except ImportError as e:
        assert "numba-cuda" in str(e) and e.name == "numba", e
    else:
        raise AssertionError("no ImportError")
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(cma.__file__))))
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
