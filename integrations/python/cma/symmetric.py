"""Symmetric memory from Python: buffers that every member of a group can
read and write directly, nvmath-python style.

    from mpi4py import MPI
    import cma.symmetric as sym
    buf = sym.allocate((1024,), "float32", MPI.COMM_WORLD)   # collective
    buf.local            # this rank's array
    buf.peers[r]         # rank r's array, writable from here
    buf.signals[r]       # rank r's signal area (uint8)
    sym.free(buf)        # collective; cached: the next same-size allocate is free

One member per process. `comm` is anything with Get_rank(), Get_size() and
an all-gather of fixed-size bytes: allgather_bytes(data) -> [bytes per rank]
if it has one (cma.torch.symmetric's group does, over uint8 tensors), else
mpi4py's buffer Allgather, else allgather(data); it is used once per heap,
to bootstrap the authenticated socket rendezvous (file descriptors cannot
travel through it). Only bytes cross it, and cma checks every rank's part
(type and length) before use and never unpickles anything: the transport
is not trusted. A comm whose allgather pickles (mpi4py's lowercase one,
torch's all_gather_object) would unpickle what other ranks send, so cma
prefers the byte-buffer forms.
Across hosts, pass host= (this process's host id), token= (the launcher's
rendezvous token, the same everywhere) and leaders= (a communicator among
each host's first rank, or a callable that makes one from their ranks,
called on every rank): Heap(comm, host=socket.gethostname(), token=token,
leaders=lambda ranks: make_comm(ranks)). Members on other hosts outside
this NVLink domain get None in peers and signals, and buf.unreachable
says which ranks and why.
Arrays are CuPy arrays when the backend is CUDA and CuPy is installed,
otherwise objects with __cuda_array_interface__ (numpy arrays on the host
backend). Every call is collective: the same order on every rank.
"""
import ctypes
import math
import operator

import numpy

from cma import _lib

_ALLGATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                              ctypes.c_void_p)
_heaps = {}


class _DeviceArray:
    """Raw device memory as __cuda_array_interface__; keeps `owner` alive."""

    def __init__(self, ptr, shape, dtype, owner):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": dtype.str,
                                         "data": (ptr, False), "version": 3, "stream": None}


class Heap:
    """A symmetric heap over `comm`'s ranks, one per process, on `device`.

    `options` is the C ABI's string; "non_dumpable:1" keeps other processes
    of this user out of the buffers (/proc/PID/mem) while the heap holds
    memory, at the cost of core dumps and debugger attach meanwhile;
    "handles:fabric" exports fabric handles (multi-node NVLink), probed at
    creation, and "handles:fabric_or_fd" falls back to POSIX FDs (one host)
    where a device cannot.

    `provider` picks where the memory comes from: "vmm" (the default: VMM
    handles shared between the processes of a host) or "nvshmem" (NVSHMEM's
    symmetric heap, loaded at run time; one rank per process and GPU;
    buf.put/buf.get reach ranks that have no pointer here). Same caching,
    statistics and collective rules; ValueError for another name.

    Across hosts (cma_symmetric_create_multi_host): `host` names this
    process's host (the same on every rank of a host), `token` is the
    launcher's rendezvous token (the same on every rank; never through the
    framework's store), and `leaders` is a communicator among each host's
    first rank (in rank order), or a callable that makes one from their
    ranks, called on every rank (torch: lambda ranks: a comm over
    dist.new_group(ranks)). `comm` is used during the creation only;
    `leaders` is kept and used on leaders in every collective. Sets
    self.hosts, self.leader_ranks and self.host_index. Errors: TypeError or
    ValueError for arguments of the wrong kind, CmaError (on every rank
    together once the ranks have met) for everything the C ABI refuses."""

    def __init__(self, comm, device=0, timeout=60.0, options="", host=None, token=None,
                 leaders=None, provider="vmm"):
        if provider not in ("vmm", "nvshmem"):
            raise ValueError(f"cma.symmetric: provider must be 'vmm' or 'nvshmem', not {provider!r}")
        if provider != "vmm":
            options = f"{options},provider:{provider}" if options else f"provider:{provider}"
        self.provider = provider
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.device = device
        lib = _lib.lib()
        self._callback = _allgather(comm, self.world_size)  # must outlive the create call
        ranks, devices = (ctypes.c_int * 1)(self.rank), (ctypes.c_int * 1)(device)
        if host is None:
            if token is not None or leaders is not None:
                raise ValueError("cma.symmetric: token= and leaders= go with host= (across hosts)")
            h = lib.cma_symmetric_create(self.world_size, ranks, devices, 1, self.rank,
                                         self.world_size,
                                         ctypes.cast(self._callback, ctypes.c_void_p), None,
                                         float(timeout), options.encode())
        else:
            h = self._create_multi_host(comm, ranks, devices, timeout, options, host, token,
                                        leaders)
        if not h:
            raise _lib._error()
        self._h = h
        self.signal_bytes = lib.cma_symmetric_signal_size(h)

    def _create_multi_host(self, comm, ranks, devices, timeout, options, host, token, leaders):
        problem = None
        if not isinstance(host, str) or not isinstance(token, str):
            problem = _PROBLEMS[1]
        elif "\0" in host or not 1 <= len(host.encode()) <= _HOST_BYTES:
            problem = _PROBLEMS[2]
        # One gather carries every rank's host and any local problem, so that
        # bad input on one rank fails every rank here (the others would wait
        # in the next collective). The leaders (each host's first rank) are
        # then known to every rank, so that a framework can make their group.
        # A fixed-size record of bytes, checked before use (never pickled).
        kind = 0 if problem is None else (1 if "must be str" in problem else 2)
        record = bytes([kind]) + (host.encode() if kind == 0 else b"").ljust(_HOST_BYTES, b"\0")
        gathered = [_host_record(r, part)
                    for r, part in enumerate(_gather_bytes(comm, record, self.world_size))]
        bad = [(r, k) for r, (k, _) in enumerate(gathered) if k != 0]
        if bad:
            r, k = bad[0]
            error = TypeError if k == 1 else ValueError
            raise error(f"cma.symmetric: rank {r}: {_PROBLEMS[k]}")
        hosts = [h for _, h in gathered]
        self.hosts = list(dict.fromkeys(hosts))
        self.leader_ranks = [hosts.index(h) for h in self.hosts]
        self.host_index = self.hosts.index(host)
        if leaders is not None and not any(
                hasattr(leaders, m) for m in ("allgather_bytes", "Allgather", "allgather")):
            leaders = leaders(list(self.leader_ranks))
        # Kept: the heap calls it on leaders in every collective.
        self._leaders_callback = None
        if leaders is not None and self.rank in self.leader_ranks:
            self._leaders_callback = _allgather(leaders, len(self.leader_ranks))
        lcb = (ctypes.cast(self._leaders_callback, ctypes.c_void_p)
               if self._leaders_callback is not None else None)
        return _lib.lib().cma_symmetric_create_multi_host(
            self.world_size, ranks, devices, 1, self.rank, self.world_size, host.encode(),
            token.encode(), ctypes.cast(self._callback, ctypes.c_void_p), None, lcb, None,
            float(timeout), options.encode())

    def allocate(self, shape, dtype, make_symmetric=False):
        """Collective: a SymmetricBuffer of `shape` (an int or a sequence of
        positive ints) and `dtype`. ValueError naming the shape when a
        dimension is not a positive integer or the buffer's bytes are more
        than the heap can hold; every rank fails together then (the heap's
        error on the others)."""
        dtype = numpy.dtype(dtype)
        dims, a = self._allocate(shape, dtype.itemsize, dtype, make_symmetric)
        return SymmetricBuffer(self, a, dims, dtype)

    def _allocate(self, shape, itemsize, dtype, make_symmetric):
        """(the shape as a tuple of ints, the C allocation) for `shape` of
        elements of `itemsize` bytes; `dtype` names them in errors."""
        dims, nbytes, problem = _request(shape, itemsize, dtype)
        # A request refused here still joins the heap's collective, as a
        # request the heap refuses on every rank (0 bytes; past size_t, the
        # largest size_t, too large), so that the other ranks fail with it
        # now rather than wait out their timeout.
        request = 0 if problem else min(nbytes, _SIZE_MAX)
        a = _lib.lib().cma_symmetric_alloc(self._h, request, int(make_symmetric))
        if a and not problem:
            return dims, a
        if problem:
            raise ValueError(problem)
        error = _lib._error()
        if nbytes > _SIZE_MAX:
            raise ValueError(f"cma.symmetric: shape {dims} of {dtype} is {nbytes} bytes, more "
                             f"than a byte count can hold (2**64 - 1)") from error
        if f"a request of {request} bytes is too large" in str(error):
            raise ValueError(f"cma.symmetric: shape {dims} of {dtype} is {nbytes} bytes, more "
                             f"than the heap can hold ({error})") from error
        raise error

    def free(self, buf):
        if buf._a is None:
            raise ValueError("cma.symmetric: buffer already freed")
        _lib._check(_lib.lib().cma_symmetric_free(self._h, buf._a))
        buf._a = None

    def empty_cache(self):
        _lib._check(_lib.lib().cma_symmetric_empty_cache(self._h))

    def stats(self):
        return _lib._json(_lib.lib().cma_symmetric_stats_json(self._h))

    def register_nccl_window(self, buf, comm):
        """Collective: registers this rank's buffer of `buf` (signal area
        included) as a symmetric window of `comm`, an ncclComm_t (an int) of
        the NCCL already loaded in this process whose rank and size are this
        heap's, so that NCCL's symmetric collectives run on it. Returns the
        ncclWindow_t (an int). Cached with the buffer: again, or after a free
        and a cached allocate, it makes no NCCL call. A freed buffer is
        refused on every rank together (CmaError)."""
        window = ctypes.c_void_p()
        _lib._check(_lib.lib().cma_symmetric_register_nccl_window(self._h, buf._a, comm,
                                                                  ctypes.byref(window)))
        return window.value

    def release_nccl_windows(self, comm):
        """Collective: deregisters every window on `comm`; call it on every
        rank before the communicator is destroyed. Returns how many went."""
        n = _lib.lib().cma_symmetric_release_nccl_windows(self._h, comm)
        if n < 0:
            raise _lib._error()
        return n

    def close(self):
        """Releases what this process mapped (not collective)."""
        if self._h:
            _lib.lib().cma_symmetric_destroy(self._h)
            self._h = None


# The C ABI's byte counts are size_t.
_SIZE_MAX = (1 << 64) - 1


def _request(shape, itemsize, dtype):
    """(shape as a tuple of ints, its byte count, None), or (shape, 0, why)
    when it is not a shape: an int or a sequence of ints (bool is not one),
    each positive, of elements of `itemsize` bytes (> 0). The product is
    Python's, exact at any size: numpy.prod wraps past 2**63 without a word,
    and a wrapped count once asked the heap for far fewer bytes than the
    arrays made over the buffer span."""
    def is_int(d):
        if isinstance(d, (bool, numpy.bool_)):
            return False
        try:
            operator.index(d)
        except TypeError:
            return False
        return True

    if is_int(shape):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        return shape, 0, f"cma.symmetric: shape {shape!r} is not an int or a sequence of ints"
    for d in dims:
        if not is_int(d) or operator.index(d) <= 0:
            return dims, 0, (f"cma.symmetric: shape {dims!r}: every dimension must be a "
                             f"positive integer, not {d!r}")
    dims = tuple(operator.index(d) for d in dims)
    if itemsize <= 0:
        return dims, 0, (f"cma.symmetric: shape {dims!r}: {dtype} has no size (name one: "
                         f"'S8', not 'S')")
    return dims, math.prod(dims) * itemsize, None


# The host gather's record: a kind (0: ok; else a problem of _PROBLEMS)
# and the host id, NUL-padded.
_HOST_BYTES = 64
_PROBLEMS = {
    1: ("host= and token= must be str (host: this process's host id; token: the launcher's, "
        "the same on every process)"),
    2: "host= must be 1 to 64 bytes of UTF-8 without NUL",
}


def _host_record(rank, part):
    """A rank's (kind, host) from its gathered record, checked."""
    kind, raw = part[0], part[1:].rstrip(b"\0")
    try:
        host = raw.decode()
    except UnicodeDecodeError:
        host = None
    if kind not in (0, 1, 2) or (kind == 0 and (not host or "\0" in host)) or \
            (kind != 0 and raw):
        raise ValueError(f"cma.symmetric: rank {rank} sent a malformed host record")
    return kind, host


def _gather_bytes(comm, data, count):
    """Every rank's `data` (bytes of one length on every rank), in rank order,
    through comm's byte all-gather (see the module's docstring). Each part
    is checked to be bytes of that length; nothing is unpickled here."""
    if hasattr(comm, "allgather_bytes"):
        parts = comm.allgather_bytes(data)
    elif hasattr(comm, "Allgather"):  # mpi4py's buffer form: no pickle
        out = numpy.empty(len(data) * count, dtype=numpy.uint8)
        comm.Allgather(numpy.frombuffer(data, dtype=numpy.uint8), out)
        parts = [out[i * len(data):(i + 1) * len(data)].tobytes() for i in range(count)]
    else:
        parts = comm.allgather(data)
    parts = list(parts)
    if len(parts) != count or any(type(p) is not bytes or len(p) != len(data) for p in parts):
        raise ValueError(f"cma.symmetric: the all-gather returned {len(parts)} parts, not "
                         f"{count} of {len(data)} bytes each")
    return parts


def _allgather(comm, count):
    """A C all-gather callback over comm's byte all-gather (fixed-size)."""

    def allgather(_ctx, send, length, recv):
        try:
            parts = _gather_bytes(comm, ctypes.string_at(send, length), count)
            ctypes.memmove(recv, b"".join(parts), length * count)
            return 0
        except Exception:  # noqa: BLE001 - reported to C as a failure
            return 1

    return _ALLGATHER(allgather)


class SymmetricBuffer:
    """One collective allocation: this rank's array, every peer's, the signals."""

    def __init__(self, heap, a, shape, dtype):
        self.heap, self._a, self.shape, self.dtype = heap, a, shape, dtype
        self.nbytes = _lib.lib().cma_symmetric_size(a)  # the group's size (make_symmetric)
        lib = _lib.lib()
        self.peer_ptrs = [lib.cma_symmetric_peer(a, r) for r in range(heap.world_size)]
        self.signal_ptrs = [lib.cma_symmetric_signal(a, r) for r in range(heap.world_size)]
        self.device_peers = lib.cma_symmetric_device_peers(a)
        # Across hosts: {rank: why} for members with no pointer here (their
        # peer_ptrs, peers and signals entries are None).
        u = _lib._json(lib.cma_symmetric_unreachable_json(a))
        self.unreachable = {r: u["reason"] for r in u["ranks"]}
        self._peers = self._signals = None

    # Arrays are made on first use: a framework that wraps the pointers
    # itself (cma.torch.symmetric) pays nothing for them.
    @property
    def peers(self):
        if self._peers is None:
            self._peers = [_array(p, self.shape, self.dtype, self) if p else None
                           for p in self.peer_ptrs]
        return self._peers

    @property
    def signals(self):
        if self._signals is None:
            self._signals = [_array(p, (self.heap.signal_bytes,), numpy.dtype("uint8"), self)
                             if p else None for p in self.signal_ptrs]
        return self._signals

    @property
    def local(self):
        return self.peers[self.heap.rank]

    def put(self, rank, src, nbytes, offset=0, stream=0):
        """Copies `nbytes` from the local address `src` (an int) into rank's
        buffer at byte `offset`, in `stream`'s order (a cudaStream_t as an
        int; 0: the default stream): directly where rank is mapped here,
        through NVSHMEM's put otherwise. Not collective."""
        self._transfer(_lib.lib().cma_symmetric_put, rank, src, nbytes, offset, stream)

    def get(self, rank, dst, nbytes, offset=0, stream=0):
        """The reverse of put: rank's bytes at `offset` into local `dst`."""
        self._transfer(_lib.lib().cma_symmetric_get, rank, dst, nbytes, offset, stream)

    def _transfer(self, fn, rank, local, nbytes, offset, stream):
        if self._a is None:
            raise ValueError("cma.symmetric: buffer already freed")
        _lib._check(fn(self._a, int(rank), int(offset), int(local), int(nbytes), int(stream) or None))


def _array(ptr, shape, dtype, owner):
    n = math.prod(shape) * dtype.itemsize  # shape: checked by _request, within the buffer
    if _lib.backend_name() == "host":
        return _lib.host_view(ptr, n, owner=owner).view(dtype).reshape(shape)
    try:
        import cupy
    except ImportError:
        return _DeviceArray(ptr, shape, dtype, owner)
    # A peer's buffer is used from this member's device, whichever GPU holds
    # its pages: say so, rather than let CuPy ask the driver.
    mem = cupy.cuda.UnownedMemory(ptr, n, owner, device_id=owner.heap.device)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0))


def heap_for(comm, device=0, **kwargs):
    """The process's heap for `comm` (created collectively on first use)."""
    key = (id(comm), device, kwargs.get("provider", "vmm"))
    if key not in _heaps:
        _heaps[key] = Heap(comm, device, **kwargs)
    return _heaps[key]


def allocate(shape, dtype, comm, device=0, make_symmetric=False):
    """Collective: a SymmetricBuffer of `shape` and `dtype` on every rank of comm."""
    return heap_for(comm, device).allocate(shape, dtype, make_symmetric)


def make_symmetric(shape, dtype, comm, device=0):
    """Collective, for ranks that ask for different sizes: all get the largest."""
    return allocate(shape, dtype, comm, device, make_symmetric=True)


def free(buf):
    """Collective: returns the buffer to the heap's cache on every rank."""
    buf.heap.free(buf)
