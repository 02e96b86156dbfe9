"""cma's NVSHMEM symmetric provider on two GPUs, one process per GPU, beside
torch's NVSHMEM symmetric memory and a device-to-device copy.

    torchrun --nproc-per-node 2 bench/torch_nvshmem_bench.py cma   OUT_cma.json
    torchrun --nproc-per-node 2 bench/torch_nvshmem_bench.py torch OUT_torch.json

From the packaged folder (bench/gpu/package.sh), with
PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so: torchrun ...
torch_nvshmem_bench.py cma OUT.json. Each run is its own
pair of processes: NVSHMEM is initialised once per process, by cma in one
and by torch in the other, so neither measures the other's set-up.

cma: Heap(provider="nvshmem") through cma.torch.symmetric; checks that a put
into the next rank lands (read back by that rank after a barrier) and that a
get returns it, that a cached re-allocation makes no NVSHMEM call (one
agreement round), then times a cached allocate+free from Python, and the
put bandwidth (SymmetricBuffer.put: a direct copy where nvshmem_ptr maps
the peer, NVSHMEM's putmem_on_stream where it does not) against a
cross-device copy_ from cuda:0 to cuda:1 in rank 0 (torch issues
cudaMemcpyPeerAsync for it: the cudaMemcpyPeer baseline).
torch: torch.distributed._symmetric_memory with set_backend("NVSHMEM"):
cached empty+rendezvous, and a copy_ into the peer's buffer.
Goals (issue 33): cma cached allocate+free <= 100 us; put >= 90% of the copy.
Rank 0 writes the JSON; the exit code is the check (cma) or 0 (torch).
NVSHMEM comes from the pip package nvidia-nvshmem-cu13 (torch's); cma finds
libnvshmem_host.so.3 through LD_LIBRARY_PATH or CMA_NVSHMEM_LIBRARY."""
import json
import os
import sys
import time

# cma's Python package: PYTHONPATH (run_all.sh's py/), else beside the script
# (the packaged folder's py/) or the repository's integrations/python.
_here = os.path.dirname(os.path.abspath(__file__))
for _p in (os.path.join(_here, "..", "integrations", "python"), os.path.join(_here, "py")):
    if os.path.isdir(os.path.join(_p, "cma")):
        sys.path.insert(0, _p)

N = 64 << 20  # float32 elements: 256 MiB


def timed(fn, reps):
    import torch
    import torch.distributed as dist
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def peer_copy_baseline(results):
    """Rank 0: cuda:0 -> cuda:1 copy_ (cudaMemcpyPeerAsync), GB/s."""
    import torch
    if torch.cuda.device_count() < 2:
        results["copy_peer_error"] = "fewer than 2 visible GPUs in rank 0"
        return
    a = torch.ones(N, device="cuda:0")
    b = torch.empty(N, device="cuda:1")
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    t0 = time.perf_counter()
    for _ in range(20):
        b.copy_(a)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    results["copy_peer_GBps"] = N * 4 * 20 / (time.perf_counter() - t0) / 1e9


def cma_mode(rank, world, results):
    import torch
    import cma  # noqa: F401
    import cma.torch
    sm = cma.torch.symmetric
    sm.set_provider("nvshmem")
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    t0 = time.perf_counter()
    t = sm.empty((N,), dtype=torch.float32)  # NVSHMEM's initialisation, then one allocation
    results["cma_first_alloc_with_init_ms"] = (time.perf_counter() - t0) * 1e3
    buf = sm._live[t.data_ptr()][0]
    results["cma_unreachable"] = buf.unreachable
    src = torch.full((N,), float(rank + 1), device="cuda")
    sm.put(t, nxt, src)  # into the next rank's copy
    torch.cuda.synchronize()
    sm.rendezvous(t).barrier()
    ok = bool(torch.all(t == float(prv + 1)).item())
    back = torch.empty(N, device="cuda")
    sm.get(t, nxt, back)
    torch.cuda.synchronize()
    ok = ok and bool(torch.all(back == float(rank + 1)).item())
    sm.free(t)
    before = sm.memory_stats()
    t2 = sm.empty((N,), dtype=torch.float32)
    after = sm.memory_stats()
    ok = ok and after["cache_hits"] == before["cache_hits"] + 1 \
        and after["exchanges"] == before["exchanges"] + 1
    sm.free(t2)
    results["cma_cached_alloc_free_us"] = timed(
        lambda: sm.free(sm.empty((N,), dtype=torch.float32)), 500) * 1e6
    t3 = sm.empty((N,), dtype=torch.float32)
    results["cma_put_GBps"] = N * 4 / timed(lambda: sm.put(t3, nxt, src), 20) / 1e9
    results["cma_get_GBps"] = N * 4 / timed(lambda: sm.get(t3, nxt, back), 20) / 1e9
    torch.distributed.barrier()
    sm.free(t3)
    return ok


def torch_mode(rank, world, results):
    import torch
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as tsm
    tsm.set_backend("NVSHMEM")
    group = dist.group.WORLD

    def alloc(size):
        x = tsm.empty((size,), dtype=torch.float32, device=f"cuda:{rank}")
        tsm.rendezvous(x, group.group_name)
        return x
    t0 = time.perf_counter()
    alloc(N)
    results["torch_first_alloc_with_init_ms"] = (time.perf_counter() - t0) * 1e3
    results["torch_cached_alloc_free_us"] = timed(lambda: alloc(N), 500) * 1e6
    x = alloc(N)
    peer = tsm.rendezvous(x, group.group_name).get_buffer((rank + 1) % world, (N,), torch.float32)
    src = torch.ones(N, device="cuda")
    results["torch_peer_write_GBps"] = N * 4 / timed(lambda: peer.copy_(src), 20) / 1e9
    dist.barrier()
    return True


def main():
    import torch
    import torch.distributed as dist
    which, out_path = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    world = dist.get_world_size()
    results = {"impl": which, "world": world}
    if rank == 0:
        peer_copy_baseline(results)
    try:
        ok = cma_mode(rank, world, results) if which == "cma" else torch_mode(rank, world, results)
    except Exception as e:  # noqa: BLE001 - reported in the JSON, and the exit code
        results[f"rank{rank}_error"] = repr(e)[:500]
        ok = False
    oks = [None] * world
    dist.all_gather_object(oks, ok)
    results["check_all_ranks"] = all(oks)
    if rank == 0:
        base = results.get("copy_peer_GBps")
        for key in ("cma_put_GBps", "torch_peer_write_GBps"):
            if base and key in results:
                results[key.replace("GBps", "vs_copy_peer")] = results[key] / base
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
        print(json.dumps(results))
    dist.destroy_process_group()
    sys.exit(0 if all(oks) else 1)


if __name__ == "__main__":
    main()
