"""The one aliasing primitive of cma.torch: a tensor on another device over
the same cma allocation (same data_ptr), for move(), zero_copy() and the
managed_cpu() switch.

Every alias of an allocation holds one _Root, which holds the storage that
owns the allocation, so the memory lives while the source or any alias
does, and an alias of an alias holds the same root (round trips build no
chain of owners). The alias shares its source's version counter, as a view
shares its base's: autograd sees an in-place write through either.
"""
import weakref

import torch

from cma import _lib
from cma.torch._ext import build


def share_version(alias, source):
    """`alias` (a tensor over `source`'s memory) counts in-place writes with
    `source`'s version counter; returns it (cuda_allocator.cc)."""
    build.build().share_version_counter(alias, source)
    return alias


def owned_storage(tensor):
    """(address, bytes) of the storage of a tensor that owns a cma
    allocation; ValueError for any other tensor."""
    ptr = tensor.untyped_storage().data_ptr()
    if _lib.allocation_size(ptr) is None:
        raise ValueError("cma.torch: the tensor does not own a cma allocation (allocate it "
                         "under cma.torch.use_as_default(), or on the CPU under "
                         "cma.torch.managed_cpu())")
    return ptr, tensor.untyped_storage().nbytes()


class _Root:
    """The storage that owns a cma allocation, held by all its aliases."""
    __slots__ = ("storage", "__weakref__")

    def __init__(self, storage):
        self.storage = storage


# ptr -> weakref to its _Root while any alias of it lives: an alias of an
# alias holds the same root, so repeated round trips build no chain.
_roots = {}


def _root_of(storage, ptr):
    ref = _roots.get(ptr)
    root = ref() if ref is not None else None
    if root is None:
        root = _Root(storage)

        def forget(r, ptr=ptr):
            if _roots.get(ptr) is r:
                del _roots[ptr]
        _roots[ptr] = weakref.ref(root, forget)
    return root


class _CudaBuffer:
    def __init__(self, ptr, nbytes, owner):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (ptr, False), "version": 3, "stream": None}


def make_alias(tensor, device):
    """A tensor on `device` (cpu or cuda:N) over `tensor`'s storage, viewed
    like `tensor` (size, stride, offset). The caller has placed the pages
    (cma's move) and checked that the storage is a cma allocation."""
    storage = tensor.untyped_storage()
    ptr, nbytes = storage.data_ptr(), storage.nbytes()
    root = _root_of(storage, ptr)
    if device.type == "cpu":
        raw = torch.from_numpy(_lib.host_view(ptr, nbytes, owner=root))
    else:
        raw = torch.as_tensor(_CudaBuffer(ptr, nbytes, root), device=device)
    # Shared before the views are made, so that they all share it (as views do).
    return share_version(raw, tensor).view(tensor.dtype).as_strided(
        tensor.size(), tensor.stride(), tensor.storage_offset())
