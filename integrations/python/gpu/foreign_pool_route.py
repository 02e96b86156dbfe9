"""MemPool(allocator=...) under cma (a pool whose segments come from that allocator), in a fresh process,
for torch_gpu_test.py: a tiny pluggable allocator (cudaMallocManaged /
cudaFree with call counters) serves a MemPool's memory the way PyTorch's
own TestMemPool tests expect (test_mempool_with_allocator,
test_mempool_empty_cache_inactive, test_tensor_delete_after_allocator_delete,
test_mempool_limited_memory_with_allocator,
test_deleted_mempool_not_used_on_oom), plus record_stream safety, nesting
with cma's own pools, statistics and the memory fraction. Each check is True
when it holds, or a string saying what happened.
    python3 foreign_pool_route.py  ->  JSON"""
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import cma  # noqa: E402
import cma.torch as cmat  # noqa: E402
from route_checks import make_check  # noqa: E402

cmat.use_as_default()
out = {}
MiB = 1 << 20
NELEM_1MB = MiB // 4

_SOURCE = """
#include <torch/extension.h>
#include <ATen/cuda/Exceptions.h>
#include <cuda_runtime_api.h>
extern "C" {
C10_EXPORT long long cma_dummy_allocs = 0;
C10_EXPORT long long cma_dummy_frees = 0;
C10_EXPORT void* cma_dummy_alloc(size_t size, int device, void* stream) {
  ++cma_dummy_allocs;
  void* ptr = nullptr;
  C10_CUDA_CHECK(cudaMallocManaged(&ptr, size));
  return ptr;
}
C10_EXPORT void cma_dummy_free(void* ptr, size_t size, int device, void* stream) {
  ++cma_dummy_frees;
  C10_CUDA_CHECK(cudaFree(ptr));
}
}
"""

from torch.utils.cpp_extension import load_inline  # noqa: E402

_LIB_PATH = load_inline(name="cma_foreign_dummy_allocator", cpp_sources=_SOURCE,
                        is_python_module=False, keep_intermediates=False, with_cuda=True)
_LIB = ctypes.CDLL(_LIB_PATH)
ALLOCS = ctypes.c_longlong.in_dll(_LIB, "cma_dummy_allocs")
FREES = ctypes.c_longlong.in_dll(_LIB, "cma_dummy_frees")


def dummy():
    return torch.cuda.memory.CUDAPluggableAllocator(_LIB_PATH, "cma_dummy_alloc",
                                                    "cma_dummy_free")


def counts():
    return ALLOCS.value, FREES.value


def in_pool(tensor, pool):
    """Whether the tensor's memory lies in one of the pool's segments."""
    p = tensor.untyped_storage().data_ptr()
    return any(s["address"] <= p < s["address"] + s["total_size"] for s in pool.snapshot())


def _settle():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


check = make_check(out, after=_settle)


def limited(additional_mb):
    """PyTorch's _setup_mempool_limited_memory_test."""
    torch.cuda.memory.empty_cache()
    _, all_memory = torch.cuda.memory.mem_get_info(0)
    pre_reserved = torch.cuda.memory_reserved(0)
    torch.cuda.memory.set_per_process_memory_fraction(
        (additional_mb * MiB + pre_reserved) / all_memory, 0)


def unlimited():
    torch.cuda.memory.empty_cache()
    torch.cuda.memory.set_per_process_memory_fraction(1.0)


@check("mempool_with_allocator")
def _():
    allocator = dummy()
    pool = torch.cuda.MemPool(allocator.allocator())
    if pool.use_count() != 1:
        return f"use_count at creation {pool.use_count()}"
    a0, f0 = counts()
    with torch.cuda.use_mem_pool(pool):
        out_0 = torch.randn(NELEM_1MB, device="cuda")
        if pool.use_count() != 2:
            return f"use_count inside {pool.use_count()}"
    if pool.use_count() != 1 or counts()[0] != a0 + 1:
        return ("after the context", pool.use_count(), counts(), a0)
    if not in_pool(out_0, pool):
        return "the pool's tensor is not in the pool's segments"
    outside = torch.empty(NELEM_1MB, device="cuda")  # not the pool's
    if counts()[0] != a0 + 1 or in_pool(outside, pool) or cma.device_of(outside.data_ptr()) != 0:
        return "an allocation outside the context went to the pool"
    with torch.cuda.use_mem_pool(pool):
        n0 = len(pool.snapshot())
        out_1 = torch.randn(NELEM_1MB, device="cuda")  # packed beside out_0 (2 MiB segment)
        n1 = len(pool.snapshot())
        out_2 = torch.randn(NELEM_1MB, device="cuda")  # a second segment
        n2 = len(pool.snapshot())
    if (n0, n1, n2) != (1, 1, 2):
        return f"pool segments {(n0, n1, n2)}, PyTorch's are (1, 1, 2)"
    if any(s["segment_pool_id"] != pool.id for s in pool.snapshot()):
        return "a segment of the pool's snapshot names another pool"
    del out_0, out_1, out_2, outside
    del pool  # releasePool + emptyCache(pool): the memory goes back
    return counts()[1] == f0 + 2 or f"frees {counts()[1] - f0}, want 2"


@check("empty_cache_inactive")
def _():
    allocator = dummy()
    a0, f0 = counts()

    def f():
        pool = torch.cuda.MemPool(allocator.allocator())
        with torch.cuda.use_mem_pool(pool):
            return torch.arange(1024 * 1024 * 2, device="cuda")

    x = f()
    if counts() != (a0 + 1, f0):
        return ("after the pool died with x alive", counts(), (a0, f0))
    if int(x[-1]) != 1024 * 1024 * 2 - 1:
        return "x's values"
    del x
    torch.cuda.empty_cache()
    return counts()[1] == f0 + 1 or f"frees after empty_cache {counts()[1] - f0}"


@check("tensor_delete_after_allocator_delete")
def _():
    allocator = dummy()
    pool = torch.cuda.MemPool(allocator.allocator())
    a0, f0 = counts()
    with torch.cuda.use_mem_pool(pool):
        data = torch.empty(4, device="cuda")
    del pool, allocator  # the pool keeps the allocator while its memory lives
    if counts() != (a0 + 1, f0):
        return ("before the tensor's free", counts(), (a0, f0))
    data.fill_(3)
    del data
    torch.cuda.empty_cache()
    return counts()[1] == f0 + 1 or f"frees {counts()[1] - f0}"


@check("limited_memory_with_allocator")
def _():
    allocator = dummy()
    pool_do_not_use = torch.cuda.MemPool(allocator.allocator())
    pool_use = torch.cuda.MemPool(allocator.allocator(), use_on_oom=True)
    limited(80)
    try:
        with torch.cuda.use_mem_pool(pool_do_not_use):
            a = torch.randn(40 * NELEM_1MB, device="cuda")
        with torch.cuda.use_mem_pool(pool_use):
            b = torch.randn(40 * NELEM_1MB, device="cuda")
        b_ptr = b.data_ptr()
        try:
            torch.randn(40 * NELEM_1MB, device="cuda")
            return "no OutOfMemoryError with both pools full"
        except torch.OutOfMemoryError:
            pass
        del a, b
        c = torch.randn(30 * NELEM_1MB, device="cuda")  # borrows pool_use's free block
        c_ptr = c.data_ptr()
        try:
            torch.randn(30 * NELEM_1MB, device="cuda")
            return "a pool without use_on_oom lent its block"
        except torch.OutOfMemoryError:
            pass
        del c
        if c_ptr != b_ptr:
            return "c did not reuse b's block"
        with torch.cuda.use_mem_pool(pool_use):
            e = torch.randn(20 * NELEM_1MB, device="cuda")
        e_ptr = e.data_ptr()
        del e
        if e_ptr != c_ptr:
            return "e did not reuse the block"
        reserved = torch.cuda.memory_reserved(0)
        del pool_use, pool_do_not_use
        after = torch.cuda.memory_reserved(0)
        return reserved - after >= 80 * MiB or f"reserved went {reserved} -> {after}"
    finally:
        unlimited()


@check("deleted_mempool_not_used_on_oom")
def _():
    allocator = dummy()
    limited(40)
    try:
        for _ in range(10):
            pool = torch.cuda.MemPool(allocator.allocator(), use_on_oom=True)
            with torch.cuda.use_mem_pool(pool):
                a = torch.randn(40 * NELEM_1MB, device="cuda")
            del a, pool
        new_pool = torch.cuda.MemPool(allocator.allocator(), use_on_oom=True)
        with torch.cuda.use_mem_pool(new_pool):
            a = torch.randn(40 * NELEM_1MB, device="cuda")
        del a
        b = torch.randn(20 * NELEM_1MB, device="cuda")
        c = torch.randn(20 * NELEM_1MB, device="cuda")
        if not (in_pool(b, new_pool) and in_pool(c, new_pool)):
            return "b and c should have come from the use_on_oom pool"
        del b, c, new_pool
        return True
    finally:
        unlimited()


@check("record_stream_waits_for_other_streams")
def _():
    pool = torch.cuda.MemPool(dummy().allocator())
    s = torch.cuda.Stream()
    n = 4 * MiB
    with torch.cuda.use_mem_pool(pool):
        x = torch.zeros(n, dtype=torch.uint8, device="cuda")
        w = torch.zeros(16, device="cuda")
    x_ptr = x.data_ptr()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # keeps s busy well past the next lines
        x.fill_(1)
    x.record_stream(s)
    del x
    with torch.cuda.use_mem_pool(pool):
        y = torch.empty(n, dtype=torch.uint8, device="cuda")
    y.fill_(2)
    if y.data_ptr() == x_ptr:
        return "x's block was reused while stream s still used it"
    torch.cuda.synchronize()
    if not bool((y == 2).all()):
        return "y was overwritten by s's work"
    # An allocation outside any context: finished events return their blocks
    # (as in PyTorch, none is processed while a pool context is open).
    w2 = torch.empty(16, device="cuda")
    del w, w2
    with torch.cuda.use_mem_pool(pool):
        z = torch.empty(n, dtype=torch.uint8, device="cuda")
    return z.data_ptr() == x_ptr or "x's block never came back after s finished"


@check("nesting_with_cmas_pools")
def _():
    foreign = torch.cuda.MemPool(dummy().allocator())
    own = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(foreign):
        a = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        with torch.cuda.use_mem_pool(own):
            b = torch.empty(MiB, dtype=torch.uint8, device="cuda")
        c = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    d = torch.empty(MiB, dtype=torch.uint8, device="cuda")
    where = [(in_pool(t, foreign), in_pool(t, own)) for t in (a, b, c, d)]
    want = [(True, False), (False, True), (True, False), (False, False)]
    return where == want or f"(in foreign, in own) of a, b, c, d: {where}"


@check("statistics_and_fraction")
def _():
    pool = torch.cuda.MemPool(dummy().allocator())
    r0 = torch.cuda.memory_reserved(0)
    m0 = torch.cuda.memory_allocated(0)
    with torch.cuda.use_mem_pool(pool):
        t = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")  # one 12 MiB segment
    dr = torch.cuda.memory_reserved(0) - r0
    dm = torch.cuda.memory_allocated(0) - m0
    if dr != 12 * MiB or dm != 12 * MiB:
        return f"reserved +{dr}, allocated +{dm}; want 12 MiB each"
    segs = [s for s in torch.cuda.memory_snapshot() if s["segment_pool_id"] == pool.id]
    if len(segs) != 1 or segs[0]["blocks"][0]["address"] != t.data_ptr():
        return f"snapshot segments of the pool: {segs[:2]}"
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    try:
        f = torch.cuda.get_per_process_memory_fraction(0)
        if f != 0.5:
            return f"fraction read back {f} with foreign bytes held"
        try:  # PyTorch's Python refuses it first (ValueError); cma's class too
            torch.cuda.set_per_process_memory_fraction(1.5, 0)
            return "a fraction of 1.5 was accepted"
        except (RuntimeError, ValueError):
            pass
        if torch.cuda.get_per_process_memory_fraction(0) != 0.5:
            return "a refused fraction changed the fraction"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    del t, pool
    return torch.cuda.memory_reserved(0) == r0 or "the pool's bytes stayed reserved"


@check("own_pools_no_split_and_use_on_oom")
def _():
    # cma's own pools: no_split hands out whole segments, one block each;
    # use_on_oom is accepted (its lending is tested on the host backend).
    lender = torch.cuda.MemPool(use_on_oom=True)
    whole = torch.cuda.MemPool(no_split=True)
    with torch.cuda.use_mem_pool(whole):
        a = torch.empty(1 << 20, device="cuda")  # 4 MiB: a 20 MiB segment, as native's
        b = torch.empty(1 << 20, device="cuda")
    segs = whole.snapshot()
    if len(segs) != 2 or any(len(s["blocks"]) != 1 for s in segs):
        return f"no_split segments: {[(s['total_size'], len(s['blocks'])) for s in segs]}"
    if any(s["total_size"] != 20 << 20 for s in segs):
        return f"no_split segment sizes: {[s['total_size'] for s in segs]}"
    del a, b, whole, lender
    return True


out["dummy_calls"] = list(counts())
print(json.dumps(out))
