"""Every attribute cma.torch replaces on PyTorch's objects, in one registry.

A Patch names the attributes it replaces (each an (object, attribute name)
pair, looked up at install(): the objects may be imported late) and how to
build the replacement from what is there. install() builds it once, from
the first attribute's current value, and puts it on every one of them;
uninstall() puts back what each held before, unless another library has
replaced cma's since (then cma's stays where it is, and `installed` is
False, so a replacement that consults it passes calls through). A patch
made with restore="always" puts back what it found whatever is there now.

The patches (registered by the modules that own them):
  torch._C._accelerator_setAllocatorSettings  _default.py: PyTorch's settings reach cma
  torch.cuda.memory._set_allocator_settings    (the deprecated setter) likewise
  torch.cuda.memory._snapshot                  _default.py: host-side marks (_torch_view)
  torch.Tensor.to / .cpu / .cuda               cpu_switch.py: moves under managed_cpu()
  multiprocessing.queues.Queue.put,            _ipc.py: a CUDA tensor put() cannot share
  multiprocessing.queues.JoinableQueue.put     raises there, not in the feeder thread
  torch.utils.data.DataLoader.__init__         dataloader.py: forkserver workers
  clip_grad_norm_ / clip_grad_value_,          training/step_in_backward.py: refused
  torch.nn.Module.zero_grad(False) (free_grads),
  torch.amp.GradScaler.scale                   while the hint is attached
Thread safety: install() and uninstall() run under the GIL, from calls that
PyTorch users make from one thread (use_as_default, managed_cpu, ...).
"""

_registry = {}  # name -> Patch


class Patch:
    def __init__(self, name, targets, make, restore="if_ours"):
        """`targets()`: the [(object, attribute)] to replace, missing
        attributes skipped; `make(current)`: the replacement, or None to
        leave everything as it is (current is already cma's, say)."""
        if restore not in ("if_ours", "always"):
            raise ValueError(f"cma.torch patch {name}: restore={restore!r}")
        self.name = name
        self._targets = targets
        self._make = make
        self._restore = restore
        self._saved = None  # [(object, attribute, previous)] while installed
        self.replacement = None

    @property
    def installed(self):
        return self._saved is not None

    def install(self):
        """Replaces the attributes (once); returns whether they are cma's now."""
        if self._saved is not None:
            return True
        found = [(obj, attr) for obj, attr in self._targets()
                 if obj is not None and hasattr(obj, attr)]
        if not found:
            return False
        new = self._make(getattr(*found[0]))
        if new is None:
            return False
        saved = [(obj, attr, getattr(obj, attr)) for obj, attr in found]
        for obj, attr, _ in saved:
            setattr(obj, attr, new)
        self._saved, self.replacement = saved, new
        return True

    def uninstall(self):
        if self._saved is None:
            return
        for obj, attr, previous in self._saved:
            now = getattr(obj, attr, None)
            if self._restore == "always" or now is self.replacement or \
                    getattr(now, "_cma_wraps", None) is previous:
                setattr(obj, attr, previous)
        self._saved, self.replacement = None, None


def register(name, targets, make, restore="if_ours"):
    """The patch called `name`, made on first registration."""
    patch = _registry.get(name)
    if patch is None:
        patch = _registry[name] = Patch(name, targets, make, restore)
    return patch


def installed():
    """The names of the patches in place now."""
    return sorted(name for name, p in _registry.items() if p.installed)
