"""PyTorch's allocator served by caching_managed_allocator: the user API.

    python -m cma.torch train.py ...        # cma is PyTorch's allocator, the script unchanged
    CMA_TORCH=1 torchrun ... train.py       # the same for any process (the wheel's .pth)

    import cma.torch as cmat
    cmat.use_as_default()                   # or in code, before CUDA initialises

Nothing is defined here; each name comes from the module that owns it:
  _default.py          use_as_default (cma as c10's CUDA allocator, _ext/), pool (retired)
  memory.py            move, prefetch, advise, mark_disposable, mark_keep, sleep, wake,
                       release_staging, forget_stream, memory_stats, last_placement_error,
                       snapshot, send_away, bring_back, memory_summary
  zero_copy_mode.py    zero_copy (the TorchFunctionMode of zero-copy .to())
  cpu_switch.py        managed_cpu (RFC-0023's switch) and its helpers
  uvm.py               RFC-0023's own names: set_enabled_uvm, get_enabled_uvm,
                       set_uvm_move_on_copy, enabled_uvm_move_on_copy, uvm_to
  _placement.py        host_tier
  training/hints.py    host_resident, step_in_backward, activation_offload, staged_step
  _ipc.py              (no names) CUDA tensors put on a multiprocessing.Queue: cma's
                       refusal raises from put(), installed by use_as_default
  distributed.py       cma.torch.symmetric: symmetric tensors over torch.distributed
                       (imported on first use: it needs torch.distributed)
The modules import one way (a test checks it): this file imports them,
none of them imports it, training/ imports the modules above it, and
_ext/build.py, _alias.py, _placement.py and _patches.py import no other
module of cma.torch but _ext.
"""
from cma.torch._default import pool, use_as_default
from cma.torch._placement import host_tier
from cma.torch.cpu_switch import (ManagedBatches, empty_managed, is_managed_cpu,
                                  managed, managed_cpu, map_location, move_counts, prefer_host)
from cma.torch.memory import (advise, bring_back, forget_stream, last_placement_error,
                              mark_disposable, mark_keep, memory_stats, memory_summary, move,
                              prefetch, release_staging, send_away, sleep, snapshot, wake)
from cma.torch.training.hints import (activation_offload, host_resident,
                                      staged_step, step_in_backward)
from cma.torch.uvm import (enabled_uvm_move_on_copy, get_enabled_uvm, set_enabled_uvm,
                          set_uvm_move_on_copy, uvm_to)
from cma.torch.zero_copy_mode import zero_copy

__all__ = ["ManagedBatches", "activation_offload", "advise", "bring_back", "empty_managed",
           "enabled_uvm_move_on_copy", "forget_stream", "get_enabled_uvm", "host_resident",
           "host_tier", "is_managed_cpu", "last_placement_error",
           "managed", "managed_cpu", "map_location", "mark_disposable", "mark_keep",
           "memory_stats", "memory_summary", "move", "move_counts", "pool", "prefer_host",
           "prefetch", "release_staging", "send_away", "set_enabled_uvm",
           "set_uvm_move_on_copy", "sleep", "snapshot", "staged_step",
           "step_in_backward", "use_as_default", "uvm_to", "wake", "zero_copy"]


def __getattr__(name):
    # cma.torch.symmetric, imported on first use (it needs torch.distributed).
    if name == "symmetric":
        from cma.torch import distributed
        return distributed
    raise AttributeError(name)
