"""Symmetric memory from Python on two GPUs, one process per GPU, and a
side-by-side benchmark against torch.distributed._symmetric_memory.

    torchrun --nproc-per-node 2 symmetric_gpu.py torch OUT.json
    mpirun -np 2 python3 symmetric_gpu.py mpi OUT.json

torch: a torch op in each rank writes into the peer's tensor, the peer reads
it after a barrier; collective free; a cached re-allocation makes no
exchange; then allocation latency (cached, fresh) and peer-write bandwidth
for cma and for torch's symmetric memory, in the same processes.
mpi: the same correctness check with mpi4py and CuPy arrays.
Rank 0 writes the results (JSON) to OUT.json; the exit code is the check."""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def torch_mode(out_path):
    import torch
    import torch.distributed as dist
    import cma
    import cma.torch
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    sm = cma.torch.symmetric
    world = dist.get_world_size()
    n = 64 << 20  # 256 MiB of float32
    dist.barrier()
    t0 = time.perf_counter()
    t = sm.empty((n,), dtype=torch.float32)  # the heap's rendezvous, then one allocation
    first_alloc_ms = (time.perf_counter() - t0) * 1e3
    h = sm.rendezvous(t)
    peer = h.get_buffer((rank + 1) % world)
    peer.fill_(float(rank + 1))  # a torch op writes into the next rank's memory
    h.barrier()
    ok = bool(torch.all(t == float((rank - 1) % world + 1)).item())
    sm.free(t)
    before = sm.memory_stats()
    t2 = sm.empty((n,), dtype=torch.float32)  # cached: no driver call, one small agreement
    after = sm.memory_stats()
    ok = ok and after["cache_hits"] == before["cache_hits"] + 1 \
        and after["exchanges"] == before["exchanges"] + 1
    unified = cma.torch.memory_stats(rank)
    ok = ok and unified["symmetric_bytes.current"] > 0
    sm.free(t2)
    results = {"check": ok, "world": world, "cma_first_alloc_with_rendezvous_ms": first_alloc_ms}

    def timed(fn, reps):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    # Allocation latency, cached (same size again) and fresh (a new size).
    results["cma_cached_alloc_free_us"] = timed(
        lambda: sm.free(sm.empty((n,), dtype=torch.float32)), 200) * 1e6
    sizes = iter(range(1, 10**6))
    results["cma_fresh_alloc_us"] = timed(
        lambda: sm.empty((n + (next(sizes) << 20),), dtype=torch.float32), 5) * 1e6
    try:
        import torch.distributed._symmetric_memory as tsm
        group = dist.group.WORLD

        def torch_alloc(size):
            x = tsm.empty((size,), dtype=torch.float32, device=f"cuda:{rank}")
            tsm.rendezvous(x, group.group_name)
            return x
        torch_alloc(n)
        results["torch_symm_cached_alloc_us"] = timed(lambda: torch_alloc(n), 200) * 1e6
        sizes2 = iter(range(1, 10**6))
        results["torch_symm_fresh_alloc_us"] = timed(
            lambda: torch_alloc(n + (next(sizes2) << 20)), 5) * 1e6
        x = torch_alloc(n)
        hx = tsm.rendezvous(x, group.group_name)
        tpeer = hx.get_buffer((rank + 1) % world, (n,), torch.float32)
    except Exception as e:  # noqa: BLE001 - reported beside cma's figures
        results["torch_symm_error"] = repr(e)[:300]
        tpeer = None
    # Peer-write bandwidth: a copy from local memory into the next rank's buffer.
    src = torch.ones(n, device="cuda")
    t3 = sm.empty((n,), dtype=torch.float32)
    cpeer = sm.rendezvous(t3).get_buffer((rank + 1) % world)
    results["cma_peer_write_GBps"] = n * 4 / timed(lambda: cpeer.copy_(src), 20) / 1e9
    if tpeer is not None:
        results["torch_symm_peer_write_GBps"] = n * 4 / timed(lambda: tpeer.copy_(src), 20) / 1e9
    dist.barrier()
    sm.free(t3)
    ok_all = [None] * world
    dist.all_gather_object(ok_all, ok)
    results["check_all_ranks"] = all(ok_all)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
        print(json.dumps(results))
    dist.destroy_process_group()
    return all(ok_all)


def mpi_mode(out_path):
    from mpi4py import MPI
    import cupy
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    cupy.cuda.Device(rank).use()
    import cma.symmetric as sym
    report = {"rank": rank}
    try:
        buf = sym.allocate((1 << 20,), "float32", comm, device=rank)
        buf.peers[(rank + 1) % world][:] = rank + 1  # a CuPy op into the next rank's memory
        cupy.cuda.runtime.deviceSynchronize()
        comm.Barrier()
        report["peer_write_seen"] = bool((buf.local == float((rank - 1) % world + 1)).all())
        sym.free(buf)
        again = sym.allocate((1 << 20,), "float32", comm, device=rank)
        report["cache_hit"] = again.heap.stats()["cache_hits"] == 1
        sym.free(again)
    except Exception as e:  # noqa: BLE001 - reported by rank 0
        report["error"] = repr(e)[:500]
    reports = comm.allgather(report)
    ok = all(r.get("peer_write_seen") and r.get("cache_hit") for r in reports)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"mpi_check_all_ranks": ok, "world": world, "ranks": reports}, f)
        print("mpi:", ok, reports)
    return ok


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    sys.exit(0 if (torch_mode(out) if mode == "torch" else mpi_mode(out)) else 1)
