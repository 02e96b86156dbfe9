"""cma.torch.symmetric: symmetric tensors over a torch.distributed group, in
the shape of torch.distributed._symmetric_memory.

    import torch.distributed as dist, cma.torch
    dist.init_process_group("nccl")             # or gloo; one rank per GPU
    t = cma.torch.symmetric.empty((1 << 20,), dtype=torch.float32)   # collective
    h = cma.torch.symmetric.rendezvous(t)
    peer = h.get_buffer((h.rank + 1) % h.world_size)  # the next rank's tensor, writable
    peer.fill_(h.rank); h.barrier()             # the peer sees it after the barrier
    cma.torch.symmetric.free(t)                 # collective, cached for the next empty()

The group bootstraps cma's authenticated socket rendezvous once, through a
fixed-size all-gather of bytes over uint8 tensors (_GroupComm.allgather_bytes;
never all_gather_object, which would unpickle what other ranks send); after
that a cached empty() of a size seen before makes no exchange and no driver
call. Every call is collective.

NCCL windows: with an NCCL group, empty(..., nccl_window=True) also
registers the buffer as a symmetric window of the group's communicator
(NCCL 2.27+), so that dist.all_reduce and friends on it run NCCL's
symmetric kernels, as torch's SymmetricMemory NCCL backend does. The
registration stays with the cached allocation (a later empty() that reuses
it costs no NCCL call). Call release_nccl_windows(group) on every rank
before dist.destroy_process_group.
"""
import math
import operator

import numpy
import torch
import torch.distributed as dist

from cma import symmetric as _sym

_live = {}  # data_ptr -> (SymmetricBuffer, group)


class _GroupComm:
    """The small part of an MPI communicator that cma.symmetric needs: an
    all-gather of fixed-size bytes over uint8 tensors. Never
    all_gather_object: it unpickles what every other rank sends, and the
    transport (the framework's store and collectives) is not trusted."""

    def __init__(self, group):
        self.group = group

    def Get_rank(self):
        return dist.get_rank(self.group)

    def Get_size(self):
        return dist.get_world_size(self.group)

    def _device(self):
        # NCCL gathers CUDA tensors only; gloo (and a CPU side of a mixed
        # group) gathers CPU ones.
        backend = str(dist.get_backend(self.group)).lower()
        if "nccl" in backend and "gloo" not in backend and "cpu" not in backend:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def allgather_bytes(self, data):
        device = self._device()
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        out = [torch.empty(len(data), dtype=torch.uint8, device=device)
               for _ in range(self.Get_size())]
        dist.all_gather(out, mine, group=self.group)
        return [bytes(t.cpu().numpy().tobytes()) for t in out]


_comms = {}
_provider = "vmm"


def set_provider(name):
    """Where later heaps take their memory: "vmm" (default) or "nvshmem"
    (as torch's set_backend("NVSHMEM")). Heaps made already keep theirs."""
    global _provider
    if name.lower() not in ("vmm", "nvshmem"):
        raise ValueError(f"cma.torch.symmetric: provider must be 'vmm' or 'nvshmem', not {name!r}")
    _provider = name.lower()


def _heap(group, device):
    key = id(group) if group is not None else None
    if key not in _comms:
        _comms[key] = _GroupComm(group)
    return _sym.heap_for(_comms[key], device, provider=_provider)


def _tensor(ptr, shape, dtype, device, owner, limit):
    """A tensor of `shape` and `dtype` over the `limit` bytes at `ptr`:
    ValueError, before any view is made, for a shape that is not one or
    that spans more than those bytes (a view past them would read and
    write whatever lies beyond the peer's buffer)."""
    dims, nbytes, problem = _sym._request(shape, _element_size(dtype), dtype)
    if problem:
        raise ValueError(problem)
    if nbytes > limit:
        raise ValueError(f"cma.torch.symmetric: shape {dims} of {dtype} is {nbytes} bytes, "
                         f"more than the {limit} bytes of the buffer")
    raw = _sym._DeviceArray(ptr, (nbytes,), numpy.dtype("uint8"), owner)
    return torch.as_tensor(raw, device=device).view(dtype).view(dims)


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def _nccl_comm(group, device):
    """The group's ncclComm_t on `device` (an int), made now if NCCL has not
    made it yet (torch creates communicators lazily)."""
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(device)
    with torch.cuda.device(device):
        comm = backend._comm_ptr()
        if not comm:
            dist.all_reduce(torch.zeros(1, device=device), group=group)
            comm = backend._comm_ptr()
    if not comm:
        raise RuntimeError("cma.torch.symmetric: the group has no NCCL communicator on " +
                           str(device))
    return comm


def empty(shape, dtype=torch.float32, group=None, device=None, nccl_window=False):
    """Collective: a tensor in symmetric memory on this rank's device; with
    nccl_window, also a symmetric window of the group's NCCL communicator."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None \
        else torch.device(device)
    heap = _heap(group, device.index)
    size = _element_size(dtype)
    # Heap.allocate's checks and collective over this dtype's element size
    # (a shape refused on one rank fails every rank together).
    dims, a = heap._allocate(shape, size, dtype, False)
    buf = _sym.SymmetricBuffer(heap, a, (math.prod(dims) * size,), numpy.dtype("uint8"))
    t = _tensor(buf.peer_ptrs[heap.rank], dims, dtype, device, buf, buf.nbytes)
    if nccl_window:
        # A rank that cannot name its communicator still joins the
        # registration (with none: refused there), so that every rank fails
        # together rather than the others waiting out their timeout.
        try:
            comm, why = _nccl_comm(group, device), None
        except Exception as e:  # noqa: BLE001 - re-raised below, after the collective
            comm, why = 0, e
        try:
            heap.register_nccl_window(buf, comm)
        except BaseException:
            heap.free(buf)  # every rank failed together: every rank frees
            if why is not None:
                raise why
            raise
    _live[t.data_ptr()] = (buf, group)
    return t


def release_nccl_windows(group=None, device=None):
    """Collective: deregisters cma's windows on the group's NCCL communicator
    (call on every rank before dist.destroy_process_group). Returns how many
    this rank released."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None \
        else torch.device(device)
    key = id(group) if group is not None else None
    if key not in _comms or (id(_comms[key]), device.index, _provider) not in _sym._heaps:
        return 0  # no heap for this group: nothing registered, none made now
    return _heap(group, device.index).release_nccl_windows(_nccl_comm(group, device))


class Handle:
    """What rendezvous() returns: every rank's view of the allocation."""

    def __init__(self, tensor, buf, group):
        self._t, self._buf, self._group = tensor, buf, group
        self.rank, self.world_size = buf.heap.rank, buf.heap.world_size
        self.buffer_ptrs = list(buf.peer_ptrs)
        self.signal_pad_ptrs = list(buf.signal_ptrs)
        self.buffer_ptrs_dev = buf.device_peers
        self.buffer_size = buf.nbytes
        self.signal_pad_size = buf.heap.signal_bytes

    def _rank(self, rank):
        # A list index would take -1 as the last rank: another rank's buffer.
        r = operator.index(rank)
        if not 0 <= r < len(self.buffer_ptrs):
            raise ValueError("cma.torch.symmetric: rank %r is not in [0, %d)"
                             % (rank, len(self.buffer_ptrs)))
        return r

    def get_buffer(self, rank, shape=None, dtype=None):
        """Rank `rank`'s tensor (this rank's view, shaped like the original)."""
        shape = self._t.shape if shape is None else shape
        dtype = self._t.dtype if dtype is None else dtype
        return _tensor(self.buffer_ptrs[self._rank(rank)], shape, dtype, self._t.device,
                       self._buf, self.buffer_size)

    def get_signal_pad(self, rank):
        return _tensor(self.signal_pad_ptrs[self._rank(rank)], (self.signal_pad_size,),
                       torch.uint8, self._t.device, self._buf, self.signal_pad_size)

    def barrier(self):
        torch.cuda.current_stream(self._t.device).synchronize()
        dist.barrier(group=self._group)


def rendezvous(tensor):
    """The handle of a tensor from empty(): peers' buffers and signal pads."""
    if tensor.data_ptr() not in _live:
        raise ValueError("cma.torch.symmetric: the tensor was not made by empty()")
    buf, group = _live[tensor.data_ptr()]
    return Handle(tensor, buf, group)


def put(tensor, rank, src, offset=0):
    """Not collective: copies `src` (a tensor on this rank's device) into
    rank's copy of `tensor` at byte `offset`, on the current stream."""
    buf, _ = _live[tensor.data_ptr()]
    stream = torch.cuda.current_stream(tensor.device).cuda_stream
    buf.put(rank, src.data_ptr(), src.numel() * src.element_size(), offset, stream)


def get(tensor, rank, dst, offset=0):
    """Not collective: rank's copy of `tensor` from byte `offset` into `dst`."""
    buf, _ = _live[tensor.data_ptr()]
    stream = torch.cuda.current_stream(tensor.device).cuda_stream
    buf.get(rank, dst.data_ptr(), dst.numel() * dst.element_size(), offset, stream)


def free(tensor):
    """Collective: the allocation goes back to the cache on every rank."""
    buf, _ = _live.pop(tensor.data_ptr())
    buf.heap.free(buf)


def memory_stats(group=None, device=None):
    device = torch.cuda.current_device() if device is None else device
    return _heap(group, device).stats()
