"""cma.torch's memory calls on tensors and devices: move and prefetch,
advice, sleep and wake, statistics and snapshots (re-exported by cma.torch).

move(tensor, device) is RFC-0023's zero-copy tensor.to(): the returned tensor
aliases the same managed memory (same data_ptr) on the other device; the data
migrates, nothing is copied, and the original storage is kept alive
(_alias.py).
"""
import torch

from cma import _lib
from cma.torch import _alias, _placement


def forget_stream(stream):
    """Call before a torch.cuda.Stream that used cma tensors is destroyed:
    waits for its work; its cached blocks then serve any stream and cma
    never uses it again (so empty_cache can release them)."""
    _lib.forget_stream(stream.cuda_stream)


def move(tensor, device, stream=None, non_blocking=False):
    """Zero-copy tensor.to(device) for a tensor allocated by this allocator.

    Ordered on `stream` (default: the current stream of the tensor's CUDA
    device, or of the target device). A move to the CPU synchronises that
    stream unless non_blocking is set, in which case the caller must
    synchronise before the CPU reads the data."""
    device = torch.device(device)
    ptr, _ = _alias.owned_storage(tensor)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    cuda_dev = device if device.type == "cuda" else tensor.device
    if cuda_dev.type != "cuda":  # the host to the host: any device's stream orders it
        owner = _lib.device_of(ptr)
        cuda_dev = torch.device("cuda", torch.cuda.current_device() if owner is None else owner)
    if stream is None:
        stream = torch.cuda.current_stream(cuda_dev)
    _lib.move(ptr, "cpu" if device.type == "cpu" else device.index, stream.cuda_stream)
    if device.type == "cpu" and not non_blocking:
        stream.synchronize()
    return _alias.make_alias(tensor, device)


def prefetch(tensor, device=None, stream=None):
    """Migrates a tensor's memory towards `device` (default: where it is)."""
    device = torch.device(device) if device is not None else tensor.device
    ptr, _ = _alias.owned_storage(tensor)
    cuda_dev = device if device.type == "cuda" else torch.device("cuda", _lib.device_of(ptr))
    stream = stream or torch.cuda.current_stream(cuda_dev)
    _lib.move(ptr, "cpu" if device.type == "cpu" else _placement.index(device), stream.cuda_stream)


def mark_disposable(tensor, disposable=True):
    """sleep() may throw this tensor's contents away (a KV cache); cleared
    when its memory is freed."""
    ptr, _ = _alias.owned_storage(tensor)
    _lib.set_disposable(ptr, disposable)


def mark_keep(tensor, keep=True):
    """sleep(level=2) keeps this tensor's contents; cleared when its memory is freed."""
    ptr, _ = _alias.owned_storage(tensor)
    _lib.set_keep(ptr, keep)


def sleep(device=None, stream=None, level=1):
    """Sleep mode, vLLM's levels, addresses kept: every cma tensor of the
    device leaves it and the idle cache is given back, so another process can
    cudaMalloc that memory (cudaMemGetInfo does not show it free); same
    tensors, same addresses after wake(). Returns the bytes.
      level 1: every tensor not marked disposable keeps its contents, copied
        at the copy engine's speed into pinned host staging that stays
        allocated across cycles (memory_stats()["host_staging_bytes.all.
        current"], at most CMA_ALLOC_CONF's sleep_staging_max; the rest
        migrates); release_staging() gives it back.
      level 2: only tensors marked with mark_keep() keep theirs; the rest
        are discarded (reload them after wake()).
      level 0: kept tensors migrate to the host by prefetch (slower; their
        contents stay readable from the CPU while asleep).
    Disposable tensors (mark_disposable) are always discarded. At levels 1
    and 2 a sleeping tensor's contents are reachable only through wake() or
    move(): reading it otherwise sees garbage."""
    device = torch.device("cuda", _placement.index(device))
    stream = stream or torch.cuda.current_stream(device)
    n = _lib.sleep(device.index, stream.cuda_stream, level)
    stream.synchronize()
    return n


def wake(device=None, stream=None, release_staging=False):
    """Brings every cma tensor of the device back (disposable and discarded
    ones populated empty, not migrated). Work queued on `stream` afterwards
    sees them. With release_staging, the pinned staging is given back once
    the copies out of it are done (the next sleep pins it again)."""
    device = torch.device("cuda", _placement.index(device))
    stream = stream or torch.cuda.current_stream(device)
    n = _lib.wake(device.index, stream.cuda_stream)
    if release_staging:
        _lib.release_sleep_staging(device.index)
    return n


def release_staging(device=None):
    """Gives back the pinned host memory sleep() keeps between cycles; returns the bytes."""
    return _lib.release_sleep_staging(_placement.index(device))


def advise(tensor, read_mostly=False, preferred=None, accessed_by=()):
    """Advice for the tensor's allocation; withdrawn when it is freed."""
    ptr, _ = _alias.owned_storage(tensor)
    if isinstance(preferred, (str, torch.device)):
        preferred = torch.device(preferred)
        preferred = "cpu" if preferred.type == "cpu" else _placement.index(preferred)
    _lib.advise(ptr, read_mostly, preferred, tuple(accessed_by))


def memory_stats(device=None):
    """This allocator's statistics with PyTorch's keys, and the symmetric
    heaps' (symmetric_bytes.current, ...) beside them: one view per device."""
    return _lib.stats(-1 if device is None else _placement.index(device))


def last_placement_error(device=None):
    """Why num_placement_errors last rose on the device (a placement hint
    the driver refused, a sleep that migrated because its copies into the
    pinned staging failed), or None."""
    return _lib.last_placement_error(_placement.index(device))


def snapshot():
    """cma's own snapshot (arenas whole, placement per block);
    torch.cuda.memory._snapshot() gives PyTorch's format."""
    return _lib.snapshot()


def _storages(tensors):
    """{device: [allocation starts]} of cma tensors (each storage once)."""
    out = {}
    for t in tensors:
        ptr, _ = _alias.owned_storage(t)
        ptrs = out.setdefault(_lib.device_of(ptr), [])
        if ptr not in ptrs:
            ptrs.append(ptr)
    return out


def _stream_for(device, stream):
    if stream is not None:
        return stream.cuda_stream
    # (A CPU tensor's memory, device -1: refused by cma, on any stream.)
    return torch.cuda.current_stream(device if device >= 0 else None).cuda_stream


def send_away(tensors, stream=None):
    """The away state: each tensor's memory (its whole allocation, all but
    the first and last 2 MiB page) waits on the host, ordered on `stream`
    (default: the current stream of its device) after the work queued there
    and on the allocation's own stream; it stops counting in reserved
    memory. Same addresses, data kept: a kernel that reads or writes it
    still works (the pages migrate on demand). bring_back() undoes it."""
    for device, ptrs in _storages(tensors).items():
        _lib.send_away(ptrs, _stream_for(device, stream))


def bring_back(tensors, stream=None):
    """The away state: each tensor's memory returns to its device, ordered as
    send_away(); raises when the device's part of the budget cannot hold it
    even with every idle cached page discarded (nothing is then moved)."""
    for device, ptrs in _storages(tensors).items():
        _lib.bring_back(ptrs, _stream_for(device, stream))


def _summary_rows(st, host, used_by_all):
    """(label, current, peak) rows of memory_summary() from cma's statistics,
    the host pool's and the device's used memory as the driver reports it."""
    g = st.get
    reserved = g("reserved_bytes.all.current", 0)
    return [
        ("Allocated (tensors on this device)", g("allocated_bytes.all.current", 0),
         g("allocated_bytes.all.peak", 0)),
        ("Reserved on the device (populated 2 MiB pages)", reserved,
         g("reserved_bytes.all.peak", 0)),
        ("  of which idle cache (free, still populated)", g("idle_populated_bytes", 0), None),
        ("Away on the host (live, sent away)", g("away_bytes.all.current", 0),
         g("away_bytes.all.peak", 0)),
        ("Host tier (live, read over the link)", g("host_resident_bytes.all.current", 0),
         g("host_resident_bytes.all.peak", 0)),
        ("Sleep staging (pinned host memory)", g("host_staging_bytes.all.current", 0),
         g("host_staging_bytes.all.peak", 0)),
        ("CPU tensors in cma (host pool, all devices)", host.get("allocated_bytes.all.current", 0),
         host.get("allocated_bytes.all.peak", 0)),
        ("Device memory used, all processes (nvidia-smi)", used_by_all, None),
        ("  of which not this allocator's", max(0, used_by_all - reserved), None),
    ]


def _format_bytes(n):
    if n is None:
        return ""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024.0


def memory_summary(device=None):
    """What lives where, as a table in the manner of
    torch.cuda.memory_summary(): tensors, the device's populated pages (what
    cma holds on it, idle cache included), what waits on the host (sent away,
    the oversubscription host tier, sleep staging, CPU tensors), and the
    device's used memory as nvidia-smi shows it, all processes together.
    Why they differ: nvidia-smi counts every process and the CUDA context;
    reserved memory counts pages, not tensors (the idle cache is kept for
    reuse, empty_cache gives it back); memory away or on the host tier is
    the host's and in no device number."""
    d = _placement.index(device)
    st = _lib.stats(d)
    host = _lib.host_stats()
    free, total = torch.cuda.mem_get_info(d)
    rows = _summary_rows(st, host, total - free)
    width = max(len(r[0]) for r in rows)
    line = "|" + "=" * (width + 32) + "|"
    out = [line, "|  cma memory summary, device %d%s|" % (d, " " * (width + 3 - len(str(d)))),
           line, "|  %-*s %13s %13s  |" % (width, "", "current", "peak"), line]
    for label, cur, peak in rows:
        out.append("|  %-*s %13s %13s  |" % (width, label, _format_bytes(cur), _format_bytes(peak)))
    out.append(line)
    return "\n".join(out)
