"""cma.symmetric on the host backend (no GPU): one rank, and two real
processes whose communicator is a pipe (what mpi4py's allgather does)."""
import ctypes
import multiprocessing
import os
import sys
import time

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


def test_nccl_windows_on_the_host_backends_communicators(host):
    comm = SoloComm()
    heap = sym.heap_for(comm)
    nccl = cma._lib.lib().cma_host_emulated_comm(0, 1, 0)
    buf = heap.allocate((1024,), "float32")
    window = heap.register_nccl_window(buf, nccl)
    assert window and heap.register_nccl_window(buf, nccl) == window  # cached
    assert heap.stats()["windows"] == 1
    other_rank = cma._lib.lib().cma_host_emulated_comm(1, 2, 0)
    with pytest.raises(cma.CmaError, match="rank 1 of 2"):
        heap.register_nccl_window(buf, other_rank)
    sym.free(buf)
    with pytest.raises(cma.CmaError, match="not live here"):
        heap.register_nccl_window(buf, nccl)      # freed: refused, not read
    again = heap.allocate((1024,), "float32")     # the cached allocation, window and all
    assert heap.register_nccl_window(again, nccl) == window
    assert heap.release_nccl_windows(nccl) == 1
    assert heap.stats()["windows"] == 0
    sym.free(again)
    heap.empty_cache()
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


def _nvshmem_rank(rank, conn, q, unreachable):
    try:
        if unreachable:
            os.environ["CMA_HOST_SHMEM_UNREACHABLE"] = "1"  # read when the backend is made
        cma.init("", backend="host")
        heap = sym.Heap(PipeComm(rank, conn), provider="nvshmem")
        buf = heap.allocate((64,), "int32")
        other = 1 - rank
        assert (buf.peer_ptrs[other] is None) == unreachable, buf.peer_ptrs
        assert bool(buf.unreachable) == unreachable
        token = numpy.array([200 + rank], dtype=numpy.int32)
        buf.put(other, token.ctypes.data, 4, offset=4 * rank)   # into the peer's buffer
        heap.empty_cache()                                       # collective: both have put
        seen = int(buf.local[other])
        back = numpy.zeros(1, dtype=numpy.int32)
        buf.get(other, back.ctypes.data, 4, offset=4 * rank)
        with pytest.raises(Exception, match="past the allocation's 256 bytes"):
            buf.put(other, token.ctypes.data, 4, offset=256)
        q.put((rank, seen, int(back[0])))
        heap.free(buf)
        heap.empty_cache()
        heap.close()
        cma.shutdown()
    except Exception as e:  # noqa: BLE001
        q.put((rank, repr(e), 0))


def _two_ranks(target, *args):
    """target(rank, pipe end, queue, *args) in two forked processes; the
    (rank, ...) each puts on the queue, sorted."""
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe()
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, c, q) + args) for r, c in ((0, a), (1, b))]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    return results


@pytest.mark.parametrize("unreachable", [False, True])
def test_nvshmem_provider_two_processes_put_and_get(unreachable):
    results = _two_ranks(_nvshmem_rank, unreachable)
    assert results == [(0, 201, 200), (1, 200, 201)], results


def test_a_bad_provider_is_refused(host):
    with pytest.raises(ValueError, match="provider must be 'vmm' or 'nvshmem'"):
        sym.Heap(SoloComm(), provider="nccl")


def test_timeouts_beyond_a_day_are_refused(host):
    # Issue 19, item 12: past 2**31 ms (24.8 days) a timeout once became a
    # wait without deadline; Python's floats reach the C ABI unchanged.
    for t in (float("inf"), float("nan"), 25 * 86400.0, 86400.001, 0.0, -1.0):
        with pytest.raises(Exception, match="timeout must be positive and at most 24h"):
            sym.Heap(SoloComm(), timeout=t)
    sym.Heap(SoloComm(), timeout=86400.0).close()  # a day itself is allowed


# Issue 47: a shape's byte count is Python's exact product. numpy.prod
# wrapped past 2**63 without a word: (2**61 + 1, 8) uint8 came to 8 bytes,
# and the heap handed out 8 bytes for an array of 2**64 + 8. A shape whose
# dimensions are not positive integers, or whose bytes do not fit the heap,
# is a ValueError naming the shape, and nothing is allocated.
def test_huge_and_bad_shapes_are_refused_naming_the_shape(host):
    heap = sym.heap_for(SoloComm())
    too_many = "more than a byte count can hold"
    for shape, dtype, says in [
            ((2**61 + 1, 8), "uint8", too_many),            # numpy: 8 bytes
            ((2**32, 2**32), "float32", too_many),          # numpy: 0 bytes
            ((1 << 70,), "int8", too_many),
            ((2**64 - 8,), "uint8", "more than the heap can hold"),  # its stride would wrap
            ((0,), "float32", "positive integer"),
            ((4, -1), "float32", "positive integer"),
            ((2.0, 3), "float32", "positive integer"),
            (("4",), "float32", "positive integer"),
            ((True, 2), "float32", "positive integer"),
            (None, "float32", "not an int or a sequence of ints"),
            (3.5, "float32", "not an int or a sequence of ints"),
            ((4,), "S", "has no size")]:
        with pytest.raises(ValueError, match=says) as e:
            heap.allocate(shape, dtype)
        assert "cma.symmetric" in str(e.value) and \
            repr(shape) in str(e.value), (shape, str(e.value))
    assert heap.stats()["allocations"] == 0 and not cma.memory_snapshot()["symmetric"]
    # Shapes that are shapes still work, numpy's integers included.
    buf = heap.allocate((numpy.int64(4), 8), "float32")
    assert buf.shape == (4, 8) and buf.local.shape == (4, 8) and buf.nbytes == 128
    heap.free(buf)
    buf = heap.allocate(numpy.int32(5), "uint8")
    assert buf.shape == (5,)
    heap.free(buf)
    heap.close()


def _bad_shape_rank(rank, conn, q):
    try:
        cma.init("", backend="host")
        heap = sym.Heap(PipeComm(rank, conn), timeout=30.0)
        for bad in ((2**61 + 1, 8), (0,)):
            start = time.monotonic()
            try:
                heap.allocate(bad if rank == 0 else (16,), "uint8", make_symmetric=True)
                outcome = "allocated"
            except Exception as e:  # noqa: BLE001 - reported
                outcome = type(e).__name__
            q.put((rank, outcome, time.monotonic() - start < 10))
        good = heap.allocate((8 * (rank + 1),), "uint8", make_symmetric=True)  # still works
        q.put((rank, "then", good.nbytes))
        heap.free(good)
        heap.close()
        cma.shutdown()
    except Exception as e:  # noqa: BLE001
        q.put((rank, repr(e), 0))


# A shape refused on one rank fails the collective on every rank at once
# (the others would otherwise wait out their timeout), and the heap goes on.
def test_a_bad_shape_on_one_rank_fails_every_rank_at_once():
    ctx = multiprocessing.get_context("fork")
    a, b = ctx.Pipe()
    q = ctx.Queue()
    procs = [ctx.Process(target=_bad_shape_rank, args=(r, c, q)) for r, c in ((0, a), (1, b))]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=90) for _ in range(6))
    for p in procs:
        p.join(timeout=60)
    assert results == [(0, "ValueError", True), (0, "ValueError", True), (0, "then", 16),
                       (1, "CmaError", True), (1, "CmaError", True), (1, "then", 16)], results


def test_two_processes_write_into_each_others_buffers():
    results = _two_ranks(_rank)
    assert results == [(0, 101, 256), (1, 100, 256)], results


# Across hosts: 4 processes as 2 emulated hosts x 2 (CMA_HOST_EMULATED_HOST);
# every communicator is a relay in the parent over pipes.
TOKEN = "3f9a1c7e5b2d8046af13c9e7b5d20864f1a3c5e7092b4d6f8e0a2c4b6d8f1e3a"
OTHER_TOKEN = "49e1b23a0ebfed79991a10a7445a7786176b7acde3e5754db8efc12991bb8627"


class RelayComm:
    """One rank of a group whose all-gather a relay thread serves."""

    def __init__(self, rank, size, conn):
        self.rank, self.size, self.conn = rank, size, conn

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def allgather(self, obj):
        self.conn.send(obj)
        return self.conn.recv()


def _relay(conns):
    try:
        while True:
            parts = [c.recv() for c in conns]
            for c in conns:
                c.send(parts)
    except (EOFError, OSError):
        pass


class BytesOnlyRelayComm(RelayComm):
    """A transport that carries bytes only (as a store or a tensor all-gather
    does): anything else is refused, as it would have to be pickled."""

    def allgather(self, obj):
        if type(obj) is not bytes:
            raise TypeError(f"this communicator carries bytes only, not {type(obj).__name__}")
        return super().allgather(obj)


def _host_rank(rank, conn, lead_conn, token, q, comm_cls=RelayComm):
    try:
        os.environ["CMA_HOST_EMULATED_HOST"] = "pyh%d_%d" % (rank // 2, os.getppid() % 100000)
        cma.init("", backend="host")
        comm = comm_cls(rank, 4, conn)

        def leaders(ranks):
            assert ranks == [0, 2], ranks
            return comm_cls(ranks.index(rank), 2, lead_conn) if rank in ranks else None

        heap = sym.Heap(comm, timeout=20.0, host="pyh%d" % (rank // 2), token=token,
                        leaders=leaders)
        assert heap.leader_ranks == [0, 2] and heap.host_index == rank // 2
        buf = heap.allocate((64,), "int32")
        buddy = rank ^ 1
        buf.peers[buddy][rank] = 100 + rank          # same host: mapped
        others = [r for r in range(4) if r // 2 != rank // 2]
        nulls = [r for r in range(4) if buf.peers[r] is None and buf.signals[r] is None]
        heap.empty_cache()                             # collective: everyone has written
        q.put((rank, int(buf.local[buddy]), nulls == others, sorted(buf.unreachable),
               all("no peer pointer" in why for why in buf.unreachable.values())))
        heap.free(buf)
        heap.close()
        cma.shutdown()
    except Exception as e:  # noqa: BLE001
        q.put((rank, repr(e)))


def _run_hosts(tokens, comm_cls=RelayComm):
    ctx = multiprocessing.get_context("fork")
    pairs = [ctx.Pipe() for _ in range(4)]
    lead = [ctx.Pipe() for _ in range(2)]
    q = ctx.Queue()
    procs = [ctx.Process(target=_host_rank,
                         args=(r, pairs[r][1], lead[r // 2][1] if r % 2 == 0 else None,
                               tokens[r], q, comm_cls)) for r in range(4)]
    for p in procs:
        p.start()
    import threading
    relays = [threading.Thread(target=_relay, args=([p[0] for p in pairs],), daemon=True),
              threading.Thread(target=_relay, args=([p[0] for p in lead],), daemon=True)]
    for t in relays:
        t.start()
    results = sorted(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    for c in pairs + lead:
        c[0].close()
    return results


def test_two_hosts_of_two_map_their_own_host_and_list_the_others():
    results = _run_hosts([TOKEN] * 4)
    assert results == [(0, 101, True, [2, 3], True), (1, 100, True, [2, 3], True),
                       (2, 103, True, [0, 1], True), (3, 102, True, [0, 1], True)], results


# Issue 47: the framework's transport is not trusted, so nothing it carries
# may be unpickled. Every gather cma makes is of bytes (checked before use):
# the multi-host set-up works over a communicator that carries bytes only
# (it once gathered a (host, problem) tuple, which only a pickling
# communicator could carry).
def test_only_bytes_cross_the_communicator():
    results = _run_hosts([TOKEN] * 4, comm_cls=BytesOnlyRelayComm)
    assert results == [(0, 101, True, [2, 3], True), (1, 100, True, [2, 3], True),
                       (2, 103, True, [0, 1], True), (3, 102, True, [0, 1], True)], results


class _FakeTensor:
    def __init__(self, arr):
        self.arr = arr

    def to(self, _device):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self.arr

    def element_size(self):
        return self.arr.itemsize


_UNPICKLED = []


class _Bomb:
    """Runs code when unpickled: what a hostile rank or store could send."""

    def __reduce__(self):
        return (_UNPICKLED.append, ("unpickled a peer's bytes",))


def _fake_torch(peer):
    """torch and torch.distributed as far as cma.torch.symmetric's group
    uses them, for a group of 2 whose other rank sends `peer(n)`; torch is
    not installed here. all_gather_object refuses: it unpickles."""
    import types
    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")
    torch.uint8, torch.float32 = numpy.uint8, numpy.float32
    torch.frombuffer = lambda b, dtype: _FakeTensor(numpy.frombuffer(bytes(b), numpy.uint8).copy())
    torch.empty = lambda n, dtype, device=None: _FakeTensor(numpy.zeros(n, dtype))
    torch.device = lambda *a: ("device",) + a
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0)
    gathers = []

    def all_gather(out, t, group=None):
        gathers.append((len(out), t.arr.dtype))
        out[0].arr[:] = t.arr
        out[1].arr[:] = numpy.frombuffer(peer(len(t.arr)), numpy.uint8)

    def all_gather_object(*_args, **_kwargs):
        import pickle
        pickle.loads(pickle.dumps(_Bomb()))  # what torch does with a peer's object
        raise AssertionError("all_gather_object: a peer's bytes were unpickled")

    dist.all_gather, dist.all_gather_object = all_gather, all_gather_object
    dist.get_rank = lambda group=None: 0
    dist.get_world_size = lambda group=None: 2
    dist.get_backend = lambda group=None: "gloo"
    torch.distributed = dist
    return torch, dist, gathers


def _distributed(monkeypatch, torch, dist):
    """cma/torch/distributed.py alone (cma.torch's own __init__ needs the
    real torch), under its own name, over the fake torch."""
    import importlib.util
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    path = os.path.join(os.path.dirname(cma.__file__), "torch", "distributed.py")
    spec = importlib.util.spec_from_file_location("cma_torch_distributed_under_test", path)
    ts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ts)
    return ts


def test_the_torch_group_gathers_bytes_and_never_unpickles(monkeypatch):
    import pickle
    payload = pickle.dumps(_Bomb())
    torch, dist, gathers = _fake_torch(lambda n: payload[:n].ljust(n, b"\0"))
    ts = _distributed(monkeypatch, torch, dist)
    comm = ts._GroupComm(None)
    mine = bytes(range(len(payload)))
    # The C ABI's all-gather callback, as the heap's bootstrap calls it.
    callback = sym._allgather(comm, 2)
    send = ctypes.create_string_buffer(mine, len(mine))
    recv = ctypes.create_string_buffer(2 * len(mine))
    rc = callback(None, ctypes.cast(send, ctypes.c_void_p), len(mine),
                  ctypes.cast(recv, ctypes.c_void_p))
    assert rc == 0
    assert recv.raw == mine + payload   # the peer's bytes, as bytes
    assert _UNPICKLED == [], _UNPICKLED
    assert gathers == [(2, numpy.uint8)]  # uint8 tensors, no object gather


# The torch views (empty(), get_buffer, get_signal_pad) count their bytes
# as Python does and never reach past their buffer: get_buffer(rank, shape)
# with a shape larger than the buffer once made a view over whatever lay
# beyond the peer's mapping, and a huge shape's count wrapped.
def test_the_torch_views_never_reach_past_their_buffer(monkeypatch):
    torch, dist, _ = _fake_torch(lambda n: bytes(n))
    ts = _distributed(monkeypatch, torch, dist)
    for shape, dtype, says in [((17,), torch.uint8, "more than the 16 bytes of the buffer"),
                               ((5,), torch.float32, "20 bytes, more than the 16 bytes"),
                               ((2**61 + 1, 8), torch.uint8, "more than the 16 bytes"),
                               ((2**62, 4), torch.float32, "more than the 16 bytes"),
                               ((0,), torch.uint8, "positive integer"),
                               ((2.0,), torch.uint8, "positive integer")]:
        with pytest.raises(ValueError, match=says):
            ts._tensor(4096, shape, dtype, "cpu", None, 16)


# get_buffer(-1) once indexed the list from its end: another rank's buffer.
def test_peer_ranks_outside_the_group_are_refused(monkeypatch):
    torch, dist, _ = _fake_torch(lambda n: bytes(n))
    ts = _distributed(monkeypatch, torch, dist)
    h = ts.Handle.__new__(ts.Handle)
    h.buffer_ptrs = [4096, 8192]
    assert h._rank(1) == 1
    for rank in (-1, 2, 1.0):
        with pytest.raises((ValueError, TypeError)):
            h._rank(rank)


def test_malformed_host_records_are_refused():
    ok = b"\0" + b"h0".ljust(64, b"\0")
    assert sym._host_record(0, ok) == (0, "h0")
    for bad in (b"\x07" + bytes(64), b"\0" + bytes(64), b"\0" + b"\xff\xfe".ljust(64, b"\0"),
                b"\x01" + b"x".ljust(64, b"\0")):
        with pytest.raises(ValueError, match="rank 3 sent a malformed host record"):
            sym._host_record(3, bad)


def test_a_wrong_token_on_one_host_fails_every_process():
    results = _run_hosts([TOKEN, TOKEN, OTHER_TOKEN, OTHER_TOKEN])
    assert [r[0] for r in results] == [0, 1, 2, 3], results
    assert all(len(r) == 2 and "did not prove" in r[1] for r in results), results


def test_bad_input_on_one_rank_fails_every_rank():
    results = _run_hosts([TOKEN, TOKEN, TOKEN, None])
    assert [r[0] for r in results] == [0, 1, 2, 3], results
    assert all(len(r) == 2 and "rank 3" in r[1] and "must be str" in r[1] for r in results), results


def test_multi_host_bad_input_is_refused(host):
    with pytest.raises(TypeError, match="host= and token= must be str"):
        sym.Heap(SoloComm(), host="h0", token=None)
    with pytest.raises(ValueError, match="go with host="):
        sym.Heap(SoloComm(), token=TOKEN)
    with pytest.raises(Exception, match="token"):
        sym.Heap(SoloComm(), host="h0", token="1234")
    with pytest.raises(ValueError, match="host= must be 1 to 64 bytes"):
        sym.Heap(SoloComm(), host="x" * 65, token=TOKEN)
    # One host, one rank: no leaders needed; every peer mapped.
    heap = sym.Heap(SoloComm(), host="h0", token=TOKEN)
    buf = heap.allocate((16,), "float32")
    assert buf.unreachable == {} and buf.peers[0] is not None
    heap.free(buf)
    heap.close()


if __name__ == "__main__":
    args = [__file__, "-q", "-p", "no:cacheprovider"]
    if os.environ.get("XML_OUTPUT_FILE"):
        args += ["--junitxml", os.environ["XML_OUTPUT_FILE"]]
    sys.exit(pytest.main(args))
