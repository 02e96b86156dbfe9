"""PyTorch RFC-0023 ("Unified Memory for PyTorch") under its own names, over
cma's switch (cpu_switch.py), moves and host pool (re-exported by cma.torch):

    RFC-0023 (torch.cuda.*)         cma.torch
    set_enabled_uvm(True)           set_enabled_uvm(True): use_as_default() + managed_cpu()
    get_enabled_uvm()               get_enabled_uvm()
    set_uvm_move_on_copy(True)      set_uvm_move_on_copy(True)
    (flag enabled_uvm_move_on_copy) enabled_uvm_move_on_copy()
    uvm_to(t)                       uvm_to(t, device, non_blocking=False)

The RFC's defaults hold for its names: the mode is off until turned on, and
enabled_uvm_move_on_copy is off until set, so after set_enabled_uvm(True)
alone CPU tensors are managed memory and .to() still copies (uvm_to moves).
cma's own managed_cpu() turns moves on with the switch. Where cma departs
from the RFC: set_enabled_uvm(False) turns the switch off (the RFC has no
off; tensors made while on stay cma's until they die, and CUDA tensors stay
cma's, as use_as_default() cannot be undone); the RFC's
PYTORCH_ENABLE_UNIFIED_MEMORY is not read (CMA_TORCH starts cma for a
process, docs/pytorch.md). docs/pytorch.md, "RFC-0023's names", has the
whole comparison, and why .to(..., managed=True) is not offered.
"""
import torch

from cma.torch import _default, cpu_switch


def set_enabled_uvm(enabled=True):
    """RFC-0023's switch: True makes cma PyTorch's CUDA allocator (if it is
    not yet: that must happen before CUDA initialises, as the RFC asks of
    its flag) and its CPU allocator (managed_cpu), with .to() moves as
    enabled_uvm_move_on_copy says. False turns the CPU switch off."""
    if not enabled:
        cpu_switch.managed_cpu(False)
        return
    _default.use_as_default()
    cpu_switch.managed_cpu(True, move_on_copy=cpu_switch.move_on_copy())
    if not cpu_switch.is_managed_cpu():
        # Only in multiprocessing's bootstrap processes (dataloader.py).
        raise RuntimeError("cma.torch.set_enabled_uvm(True): not in this process, a "
                           "multiprocessing bootstrap process (see cma.torch.dataloader)")


def get_enabled_uvm():
    """Whether the RFC's mode is on: cma serves CUDA tensors and CPU tensors
    are managed memory (managed_cpu, however it was turned on)."""
    return _default._installed and cpu_switch.is_managed_cpu()


def set_uvm_move_on_copy(enabled=True):
    """RFC-0023's enabled_uvm_move_on_copy: while the mode is on, .to(),
    .cpu() and .cuda() that change only the device of a tensor owning a
    whole cma allocation are moves (same memory, no copy; the call waits
    unless non_blocking=True), everything else PyTorch's copy. Set before
    set_enabled_uvm(True), it applies when the mode comes on."""
    cpu_switch.set_move_on_copy(enabled)


def enabled_uvm_move_on_copy():
    """The flag set_uvm_move_on_copy sets (managed_cpu() sets it too)."""
    return cpu_switch.move_on_copy()


def uvm_to(tensor, device, non_blocking=False):
    """RFC-0023's uvm_to: tensor.to(device) made a move whatever the flag
    says, for a tensor that owns a whole cma allocation (a CUDA tensor under
    use_as_default, a CPU tensor made under the switch or by empty_managed /
    managed); any other tensor is copied by PyTorch, as .to() would. The
    result aliases the source's memory (docs/pytorch.md's aliasing rules)."""
    return cpu_switch.move_or_copy(tensor, torch.device(device), non_blocking)
