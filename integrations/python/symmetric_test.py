"""cma.symmetric on the host backend (no GPU): one rank, and two real
processes whose communicator is a pipe (what mpi4py's allgather does)."""
import multiprocessing
import os
import sys

import numpy
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cma  # noqa: E402
import cma.symmetric as sym  # noqa: E402


class SoloComm:
    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def allgather(self, obj):
        return [obj]


class PipeComm:
    """Two ranks joined by a multiprocessing pipe."""

    def __init__(self, rank, conn):
        self.rank, self.conn = rank, conn

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return 2

    def allgather(self, obj):
        self.conn.send(obj)
        other = self.conn.recv()
        return [obj, other] if self.rank == 0 else [other, obj]


@pytest.fixture
def host():
    cma.init("", backend="host")
    yield
    sym._heaps.clear()
    cma.shutdown()


def test_one_rank_allocate_free_and_cache(host):
    comm = SoloComm()
    buf = sym.allocate((256,), "float32", comm)
    assert buf.local.shape == (256,) and buf.local.dtype == numpy.float32
    buf.local[:] = 3.0
    assert float(buf.peers[0].sum()) == 768.0
    assert buf.signals[0].dtype == numpy.uint8
    heap = buf.heap
    sym.free(buf)
    with pytest.raises(ValueError, match="already freed"):
        sym.free(buf)
    again = sym.allocate((256,), "float32", comm)
    assert heap.stats()["cache_hits"] == 1
    # One statistics view: symmetric bytes beside the managed allocator's.
    s = cma.memory_stats()
    assert s["symmetric_bytes.current"] > 0 and "reserved_bytes.all.current" in s
    snap = cma.memory_snapshot()
    assert [a["state"] for a in snap["symmetric"]] == ["allocated"]
    assert snap["symmetric"][0]["bytes"] == 1024 and "managed" in snap
    sym.free(again)
    heap.close()


def _rank(rank, conn, q):
    try:
        cma.init("", backend="host")
        comm = PipeComm(rank, conn)
        buf = sym.allocate((64,), "int32", comm)
        buf.peers[1 - rank][rank] = 100 + rank       # write into the peer's buffer
        buf.heap.empty_cache()                        # collective: both have written
        seen = int(buf.local[1 - rank])
        # make_symmetric: ranks ask for different sizes, both get the largest.
        grown = sym.make_symmetric((32 * (rank + 1),), "int32", comm)
        q.put((rank, seen, grown.nbytes))
        sym.free(grown)
        sym.free(buf)
        buf.heap.close()
        cma.shutdown()
    except Exception as e:  # noqa: BLE001
        q.put((rank, repr(e), 0))


def test_timeouts_beyond_a_day_are_refused(host):
    # Issue 19, item 12: past 2**31 ms (24.8 days) a timeout once became a
    # wait without deadline; Python's floats reach the C ABI unchanged.
    for t in (float("inf"), float("nan"), 25 * 86400.0, 86400.001, 0.0, -1.0):
        with pytest.raises(Exception, match="timeout must be positive and at most 24h"):
            sym.Heap(SoloComm(), timeout=t)
    sym.Heap(SoloComm(), timeout=86400.0).close()  # a day itself is allowed


def test_two_processes_write_into_each_others_buffers():
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe()
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, c, q)) for r, c in ((0, a), (1, b))]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert results == [(0, 101, 256), (1, 100, 256)], results


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
