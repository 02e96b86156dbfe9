"""PyTorch's allocator interface served by cma, in a fresh process, for
torch_gpu_test.py: caching_allocator_alloc, MemPool (use counts, pool-only
reuse, per-pool snapshot), memory fraction and OOM observers, accumulated
statistics, history with stack frames, empty_cache, and CUDA IPC refused
clearly. Each check is True when it holds, or a string saying what happened.
    python3 allocator_api_route.py  ->  JSON"""
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


check = make_check(out)


@check("allocator_is_cma")
def _():
    t = torch.empty(10, device="cuda")
    return cma.device_of(t.data_ptr()) == 0


@check("caching_allocator_alloc")
def _():
    p = torch.cuda.caching_allocator_alloc(3 * MiB)
    ok = cma.device_of(p) == 0
    torch.cuda.caching_allocator_delete(p)
    return ok


@check("mempool_semantics")
def _():
    pool = torch.cuda.MemPool()
    if pool.use_count() != 1:
        return f"use_count at creation {pool.use_count()}"
    outside = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    with torch.cuda.use_mem_pool(pool):
        inside = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
        if pool.use_count() != 2:
            return f"use_count inside the context {pool.use_count()}"
    if pool.use_count() != 1:
        return f"use_count after the context {pool.use_count()}"
    segs = pool.snapshot()
    addrs = {b["address"] for s in segs for b in s["blocks"] if b["state"] != "inactive"}
    if inside.data_ptr() not in addrs or outside.data_ptr() in addrs:
        return ("the pool's snapshot does not hold exactly its blocks", pool.id,
                inside.data_ptr(), outside.data_ptr(), sorted(addrs)[:8],
                [(s["address"], s["total_size"], s.get("segment_pool_id"),
                  [(b["address"], b["size"], b["state"]) for b in s["blocks"]][:6]) for s in segs][:4])
    freed = inside.data_ptr()
    del inside
    again = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")  # outside the pool
    if again.data_ptr() == freed:
        return "a pool's free block served an allocation outside the pool"
    with torch.cuda.use_mem_pool(pool):
        back = torch.empty(2 * MiB, dtype=torch.uint8, device="cuda")
    reused = back.data_ptr() == freed
    del back, pool
    return reused or "the pool did not reuse its own free block"


@check("memory_fraction_and_oom_observer")
def _():
    seen = []
    torch._C._cuda_attach_out_of_memory_observer(lambda *a: seen.append(a))
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.05)
    try:
        frac = torch.cuda.get_per_process_memory_fraction()
        if abs(frac - 0.05) > 0.01:
            return f"fraction read back {frac}"
        try:
            torch.empty(int(total * 0.1), dtype=torch.uint8, device="cuda")
            return "no OutOfMemoryError over the budget"
        except torch.OutOfMemoryError as e:
            if "Tried to allocate" not in str(e):
                return f"message {str(e)[:200]}"
        return len(seen) == 1 and seen[0][0] == 0 or f"observer saw {seen}"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


@check("accumulated_stats_reset")
def _():
    x = torch.empty(MiB, device="cuda")
    del x
    torch.cuda.reset_accumulated_memory_stats()
    s = torch.cuda.memory_stats()
    return s["allocation.all.allocated"] == 0 and s["num_ooms"] == 0 or \
        {k: s[k] for k in ("allocation.all.allocated", "num_ooms")}


@check("history_with_frames")
def _():
    torch.cuda.memory._record_memory_history(max_entries=1000)
    y = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"
              and e["addr"] == y.data_ptr()]
    if not allocs:
        return "no alloc trace entry"
    return any(f["filename"].endswith("allocator_api_route.py") for f in allocs[0]["frames"]) \
        or "no Python frame of this script in the trace"


@check("empty_cache_gives_back")
def _():
    z = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del z
    before = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved() < before or f"reserved stayed {before}"


@check("cuda_ipc_refused_clearly")
def _():
    t = torch.ones(1024, device="cuda")
    try:
        t.untyped_storage()._share_cuda_()
        return "sharing succeeded"
    except RuntimeError as e:
        return "caching_managed_allocator" in str(e) and "IPC" in str(e) or str(e)[:200]


out["num_device_alloc"] = cmat.memory_stats()["num_device_alloc"]
print(json.dumps(out))
