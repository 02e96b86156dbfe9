"""cma.numba on a real GPU: Numba's device arrays come from cma (the EMM
plugin), a Numba kernel writes that memory, and CuPy and PyTorch read the same
memory without a copy (__cuda_array_interface__ and DLPack), as does the host
(it is managed memory). Frees go back to cma, held back under
cuda.defer_cleanup(); memory info is cma's; IPC export is refused clearly.
Run on the GPU machine (numba-cuda, CuPy and PyTorch installed):
    python3 -m pytest -q numba_gpu_test.py          (CMA_RESULTS=file.json for results)
It imports whichever cma is importable: the installed wheel, or the
repository's package when run_all.sh sets PYTHONPATH."""
import gc
import json
import os

import numpy as np
import pytest

cma = pytest.importorskip("cma")
import cma.numba  # noqa: E402

numba_cuda = pytest.importorskip("numba.cuda")
# Before anything creates Numba's CUDA context: Numba fixes its memory
# manager when the context is made.
cma.numba.use()
if not numba_cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
from numba import cuda  # noqa: E402

RESULTS = {"cma_file": cma.__file__, "library": cma.library_path()}
N = 1 << 22  # 16 MiB of float32


@cuda.jit
def fill(a, base):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = base + i


def manager():
    return cuda.current_context().memory_manager


def address(array):
    return array.__cuda_array_interface__["data"][0]


def live():
    return cma.stats(0)["allocation.all.current"]


def test_numba_uses_the_cma_plugin():
    assert isinstance(manager(), cma.numba.CmaNumbaManager)
    assert manager().interface_version == 1


def test_numba_kernel_writes_cma_memory_that_cupy_torch_and_the_host_read():
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    before = live()
    d = cuda.device_array(N, dtype=np.float32)
    ptr = address(d)
    assert cma.device_of(ptr) == 0 and live() == before + 1
    fill[(N + 255) // 256, 256](d, 1.0)
    cuda.synchronize()
    expected = 1.0 + np.arange(N, dtype=np.float32)

    c = cupy.asarray(d)  # __cuda_array_interface__: same memory
    assert c.data.ptr == ptr
    assert bool(cupy.array_equal(c, cupy.asarray(expected)))
    t = torch.as_tensor(d, device="cuda")  # __cuda_array_interface__
    assert t.data_ptr() == ptr
    assert torch.equal(t.cpu(), torch.from_numpy(expected))
    # DLPack: CuPy exports managed memory as kDLCUDAManaged (13), which
    # torch 2.11's from_dlpack refuses (measured on an H100); torch reads it
    # through __cuda_array_interface__ above. Recorded, not asserted.
    try:
        t2 = torch.from_dlpack(c)
        RESULTS["torch_from_dlpack_of_cupy_managed"] = "accepted, same pointer: %s" % (
            t2.data_ptr() == ptr)
        del t2
    except BufferError as e:
        RESULTS["torch_from_dlpack_of_cupy_managed"] = "refused by torch: %s" % e
    host = cma.host_view(ptr, N * 4).view(np.float32)  # managed: the CPU reads it too
    assert np.array_equal(host, expected)
    RESULTS["shared_pointer"] = hex(ptr)
    RESULTS["readers"] = ["cupy (__cuda_array_interface__)", "torch (__cuda_array_interface__)",
                          "host view"]
    del c, t, host, d


def test_torch_writes_and_a_numba_kernel_reads_back():
    torch = pytest.importorskip("torch")
    d = cuda.device_array(1024, dtype=np.float32)
    t = torch.as_tensor(d, device="cuda")
    t.fill_(5.0)
    torch.cuda.synchronize()

    @cuda.jit
    def add_one(a):
        i = cuda.grid(1)
        if i < a.size:
            a[i] += 1.0

    add_one[4, 256](d)
    cuda.synchronize()
    assert np.all(d.copy_to_host() == 6.0)
    assert torch.all(t == 6.0).item()
    del t, d


def test_copies_on_a_stream_round_trip():
    s = cuda.stream()
    host = np.arange(1 << 20, dtype=np.int64)
    d = cuda.to_device(host, stream=s)
    assert cma.device_of(address(d)) == 0
    back = d.copy_to_host(stream=s)
    s.synchronize()
    assert np.array_equal(back, host)
    del d


def test_defer_cleanup_holds_frees_back():
    gc.collect()  # arrays earlier tests dropped are freed now, not inside the context
    before = live()
    with cuda.defer_cleanup():
        d = cuda.device_array(1 << 20, dtype=np.uint8)
        held = address(d)
        pending = manager().pending_frees()
        del d
        gc.collect()
        assert manager().pending_frees() == pending + 1 and live() == before + 1
        again = cuda.device_array(1 << 20, dtype=np.uint8)
        assert address(again) != held  # the held block is not handed out
        del again
        gc.collect()
    assert manager().pending_frees() == 0 and live() == before
    RESULTS["defer_cleanup"] = "frees held until the context ended"


def test_memory_info_is_cmas():
    free, total = cuda.current_context().get_memory_info()
    s = cma.stats(0)
    assert total == s["managed_budget_bytes"] > 0
    assert 0 < free <= total
    RESULTS["memory_info"] = {"free": free, "total": total}


def test_ipc_handle_is_refused_clearly():
    d = cuda.device_array(4096, dtype=np.uint8)
    with pytest.raises(RuntimeError, match="managed memory.*cannot export"):
        d.get_ipc_handle()
    RESULTS["ipc"] = "refused"
    del d


def test_out_of_memory_is_a_memory_error():
    # Over cma's budget (the device's free memory at start) but not larger
    # than the device: an out-of-memory, not a bad request.
    budget = cma.stats(0)["managed_budget_bytes"]
    device_total = cma.mem_info(0)[1]
    assert budget < device_total
    with pytest.raises(MemoryError, match="managed budget") as e:
        cuda.device_array((budget + device_total) // 2, dtype=np.uint8)
    assert isinstance(e.value, cma.CmaOutOfMemoryError)
    RESULTS["out_of_memory"] = str(e.value)[:300]


def teardown_module():
    out = os.environ.get("CMA_RESULTS")
    if out:
        with open(out, "w") as f:
            json.dump(RESULTS, f, indent=1)
