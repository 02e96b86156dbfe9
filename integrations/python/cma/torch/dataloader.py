"""DataLoader workers under cma's CPU switch (cma.torch.managed_cpu()).

CUDA does not give a forked child its parent's managed pages: a DataLoader
worker forked (Linux's default start method) from a process whose Dataset
holds tensors made under the switch dies with SIGSEGV when it reads them.
So while the switch is on, a DataLoader that has workers and no chosen
start method starts them with forkserver, and says so once on stderr:

  * "No chosen start method" means multiprocessing_context=None and
    torch.multiprocessing's start method unset or "fork". An explicit
    context (even "fork") or start method is respected.
  * CMA_DATALOADER_START=fork keeps fork (for Datasets that hold no
    tensors made under the switch and are not picklable).
  * Batches made by workers are not cma's memory (the switch is off in
    workers; they arrive in shared memory), so .to("cuda") of them copies
    from pageable memory in the training loop's thread: 0.84x the pinned
    pipeline's samples/s on an H200. A loader with workers whose caller did
    not pass pin_memory pins its batches, as pin_memory=True does
    (CMA_DATALOADER_PIN=0 keeps PyTorch's default, False).
  * forkserver pickles the Dataset, collate_fn and worker_init_fn: lambdas
    and classes defined in an interactive __main__ fail loudly. Tensors
    pickled for the workers move into shared memory (no longer cma's, so a
    later .to("cuda") of them copies). Workers restart every epoch unless
    persistent_workers=True.
  * Inside forkserver's server (which imports the user's script as
    __mp_main__), the processes forked from it and DataLoader workers the
    switch is never turned on (managed_cpu() there does nothing and
    returns False): an unguarded script would otherwise make its
    module-level tensors managed in the server, and the workers forked
    from it would die alike. Spawned processes are fresh: the switch works.

Thread safety: install() and uninstall() are called by managed_cpu() under
the GIL; the wrapper itself holds no state but a one-time notice flag. The
patch is _patches.py's "torch.utils.data.DataLoader.__init__".
"""
import functools
import inspect
import multiprocessing
import os
import sys

import torch

from cma.torch import _patches

_noticed = False

OPT_OUT_VARIABLE = "CMA_DATALOADER_START"
PIN_VARIABLE = "CMA_DATALOADER_PIN"


def in_bootstrap_process():
    """True in forkserver's server (which imports the user's script as
    __mp_main__ to preload it) and in every process forked from it, and in
    a DataLoader worker. Spawned children (torch.multiprocessing.spawn's
    ranks) are fresh processes where the switch works: not included."""
    if torch.utils.data.get_worker_info() is not None:
        return True
    forkserver = sys.modules.get("multiprocessing.forkserver")
    if forkserver is None:
        return False
    server_main = forkserver.main.__code__
    frame = sys._getframe(1)
    while frame is not None:  # the server's loop is below every frame there
        if frame.f_code is server_main:
            return True
        frame = frame.f_back
    return False


def _opted_out():
    value = os.environ.get(OPT_OUT_VARIABLE, "")
    if value not in ("", "fork", "forkserver"):
        raise ValueError(f"cma.torch: {OPT_OUT_VARIABLE}={value!r}: expected 'fork' "
                         "(keep fork for DataLoader workers) or 'forkserver' (the default)")
    return value == "fork"


def _start_method_is_fork():
    method = multiprocessing.get_start_method(allow_none=True)
    if method is None:  # nothing chosen yet (and nothing fixed by asking):
        method = multiprocessing.get_all_start_methods()[0]  # the default
    return method == "fork"


def _choose_context(bound):
    """The worker start context for one DataLoader's bound arguments: the
    caller's, or forkserver where the caller left fork by default."""
    args = bound.arguments
    workers = args.get("num_workers", 0) or 0
    if workers <= 0 or args.get("multiprocessing_context") is not None:
        return None
    if _opted_out() or not _start_method_is_fork():
        return None
    return "forkserver"


def _pins_by_default():
    value = os.environ.get(PIN_VARIABLE, "")
    if value not in ("", "0", "1"):
        raise ValueError(f"cma.torch: {PIN_VARIABLE}={value!r}: expected 0 (PyTorch's default, "
                         "no pinning) or 1 (the default under the switch: pin)")
    return value != "0"


def _choose_pin(bound):
    """Whether to pin a loader's batches the caller said nothing about:
    only with workers (their batches arrive in shared memory) and a GPU."""
    args = bound.arguments
    if "pin_memory" in args or (args.get("num_workers", 0) or 0) <= 0:
        return False
    return _pins_by_default() and torch.cuda.is_available()


def _wrap(init):
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        global _noticed
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # PyTorch's own call raises the right error
            return init(self, *args, **kwargs)
        context = _choose_context(bound) if _PATCH.installed else None
        pin = _choose_pin(bound) if _PATCH.installed else False
        if pin:
            bound.arguments["pin_memory"] = True
        if context is not None:
            bound.arguments["multiprocessing_context"] = context
        if (context is not None or pin) and not _noticed:
            _noticed = True
            print("cma.torch: while managed_cpu() is on, DataLoader workers start with "
                  "forkserver (a forked worker cannot read managed memory) and their batches "
                  "are pinned; pass multiprocessing_context= / pin_memory=, or set "
                  "CMA_DATALOADER_START=fork / CMA_DATALOADER_PIN=0, to choose",
                  file=sys.stderr)
        return init(*bound.args, **bound.kwargs)
    __init__._cma_wraps = init
    return __init__


_PATCH = _patches.register("torch.utils.data.DataLoader.__init__",
                           lambda: [(torch.utils.data.DataLoader, "__init__")], _wrap)


# Pickling a CPU storage for another process (forkserver or spawn workers,
# torch.multiprocessing queues) makes PyTorch move it into shared memory in
# place: the storage's memory is swapped and the old one freed. For a
# storage in cma's host pool that frees memory under every zero-copy alias
# of it (x.to("cuda") made before) and ends its being cma's. So while the
# switch is on, such a storage is pickled as a shared-memory copy and the
# original stays as it is. A copy costs what the in-place move costs (one
# copy into shared memory); what the parent changes afterwards is not seen
# by the children, as with any pickled data.
_reducer_saved = None  # (the reducer that was registered,) while installed


def _storage_reducer(previous):
    from cma import _lib

    def reduce(storage):
        if (storage.device.type == "cpu" and storage.nbytes() > 0 and not storage.is_shared()
                and _lib.allocation_size(storage.data_ptr()) is not None):
            copy = torch.UntypedStorage._new_shared(storage.nbytes())
            copy.copy_(storage)
            _keep_until_exit.append(copy)  # file_system sharing: the name must outlive the send
            return previous(copy)
        return previous(storage)
    reduce._cma_wraps = previous
    return reduce


_keep_until_exit = []


def _install_storage_reducer():
    global _reducer_saved
    from multiprocessing.reduction import ForkingPickler
    import torch.multiprocessing.reductions  # noqa: F401 - registers PyTorch's reducers
    if _reducer_saved is not None:
        return
    reducers = ForkingPickler._extra_reducers
    previous = reducers.get(torch.UntypedStorage)
    if previous is None:
        return
    reducers[torch.UntypedStorage] = _storage_reducer(previous)
    _reducer_saved = (previous,)


def _uninstall_storage_reducer():
    global _reducer_saved
    from multiprocessing.reduction import ForkingPickler
    if _reducer_saved is None:
        return
    reducers = ForkingPickler._extra_reducers
    if getattr(reducers.get(torch.UntypedStorage), "_cma_wraps", None) is _reducer_saved[0]:
        reducers[torch.UntypedStorage] = _reducer_saved[0]
    _reducer_saved = None


def install():
    """Wraps DataLoader.__init__ (idempotent). The choice is made per
    DataLoader at its construction, so loaders made while the switch is off
    keep fork. Also makes cma's storages pickle as copies (above)."""
    if _PATCH.installed:
        return
    _opted_out()  # a bad value fails at the switch, not at the first loader
    _pins_by_default()
    _PATCH.install()
    _install_storage_reducer()


def uninstall():
    """Puts back what install() replaced, unless another library wrapped it
    since (then cma's wrapper stays, and decides nothing while the patch is
    not installed)."""
    _PATCH.uninstall()
    _uninstall_storage_reducer()
