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
allgather(obj) (an mpi4py communicator; cma.torch.symmetric passes a
torch.distributed group); it is used once per heap, to bootstrap the
authenticated socket rendezvous (file descriptors cannot travel through it).
Arrays are CuPy arrays when the backend is CUDA and CuPy is installed,
otherwise objects with __cuda_array_interface__ (numpy arrays on the host
backend). Every call is collective: the same order on every rank.
"""
import ctypes
import json

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
    where a device cannot."""

    def __init__(self, comm, device=0, timeout=60.0, options=""):
        self.rank, self.world_size = comm.Get_rank(), comm.Get_size()
        self.device = device
        lib = _lib.lib()

        def allgather(_ctx, send, length, recv):
            try:
                parts = comm.allgather(ctypes.string_at(send, length))
                if len(parts) != self.world_size or any(len(p) != length for p in parts):
                    return 1
                ctypes.memmove(recv, b"".join(parts), length * self.world_size)
                return 0
            except Exception:  # noqa: BLE001 - reported to C as a failure
                return 1

        self._callback = _ALLGATHER(allgather)  # must outlive the create call
        ranks, devices = (ctypes.c_int * 1)(self.rank), (ctypes.c_int * 1)(device)
        h = lib.cma_symmetric_create(self.world_size, ranks, devices, 1, self.rank,
                                     self.world_size,
                                     ctypes.cast(self._callback, ctypes.c_void_p), None,
                                     float(timeout), options.encode())
        if not h:
            raise _lib._error()
        self._h = h
        self.signal_bytes = lib.cma_symmetric_signal_size(h)

    def allocate(self, shape, dtype, make_symmetric=False):
        dtype = numpy.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(numpy.prod(shape)) * dtype.itemsize
        a = _lib.lib().cma_symmetric_alloc(self._h, nbytes, int(make_symmetric))
        if not a:
            raise _lib._error()
        return SymmetricBuffer(self, a, shape, dtype)

    def free(self, buf):
        if buf._a is None:
            raise ValueError("cma.symmetric: buffer already freed")
        _lib._check(_lib.lib().cma_symmetric_free(self._h, buf._a))
        buf._a = None

    def empty_cache(self):
        _lib._check(_lib.lib().cma_symmetric_empty_cache(self._h))

    def stats(self):
        return _lib._json(_lib.lib().cma_symmetric_stats_json(self._h))

    def close(self):
        """Releases what this process mapped (not collective)."""
        if self._h:
            _lib.lib().cma_symmetric_destroy(self._h)
            self._h = None


class SymmetricBuffer:
    """One collective allocation: this rank's array, every peer's, the signals."""

    def __init__(self, heap, a, shape, dtype):
        self.heap, self._a, self.shape, self.dtype = heap, a, shape, dtype
        self.nbytes = _lib.lib().cma_symmetric_size(a)  # the group's size (make_symmetric)
        lib = _lib.lib()
        self.peer_ptrs = [lib.cma_symmetric_peer(a, r) for r in range(heap.world_size)]
        self.signal_ptrs = [lib.cma_symmetric_signal(a, r) for r in range(heap.world_size)]
        self.device_peers = lib.cma_symmetric_device_peers(a)
        self._peers = self._signals = None

    # Arrays are made on first use: a framework that wraps the pointers
    # itself (cma.torch.symmetric) pays nothing for them.
    @property
    def peers(self):
        if self._peers is None:
            self._peers = [_array(p, self.shape, self.dtype, self) for p in self.peer_ptrs]
        return self._peers

    @property
    def signals(self):
        if self._signals is None:
            self._signals = [_array(p, (self.heap.signal_bytes,), numpy.dtype("uint8"), self)
                             for p in self.signal_ptrs]
        return self._signals

    @property
    def local(self):
        return self.peers[self.heap.rank]


def _array(ptr, shape, dtype, owner):
    n = int(numpy.prod(shape)) * dtype.itemsize
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
    key = (id(comm), device)
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
