"""Numba route: cma as Numba's External Memory Management (EMM) plugin.

    import cma.numba
    cma.numba.use()            # before Numba creates its CUDA context
    # or, without code changes: NUMBA_CUDA_MEMORY_MANAGER=cma.numba

Then every device array Numba makes (cuda.device_array, to_device, ...)
lives in cma's managed memory; host memory (pinned/mapped) stays Numba's own.

Contract of CmaNumbaManager (interface_version 1):
- memalloc(size): cma memory on the context's device, ordered on the default
  stream (Numba's allocation API carries no stream). A zero-byte request gets
  a NULL pointer, as Numba's own arrays of size 0 have. Out of memory raises
  cma.CmaOutOfMemoryError (a MemoryError) with cma's message and statistics.
- Freeing: when Numba drops the MemoryPointer its finalizer frees through
  cma, at once; inside defer_cleanup() the free waits until the outermost
  defer_cleanup() exits, so the block cannot be handed out again (to any
  stream or framework sharing cma) while work that Numba deferred cleanup
  for may still use it.
- get_memory_info(): MemoryInfo(free, total) of what cma can give this
  device: total is cma's managed budget for it (by default the device's free
  memory at its first use; the device's total before that); free is the budget less the bytes allocated, and never
  more than the device reports free plus cma's idle cache.
- get_ipc_handle(): refused with a clear error. CUDA IPC (cuIpcGetMemHandle)
  cannot export managed memory; share between processes with cma's symmetric
  mode (cma.symmetric) instead.
- reset(): frees every allocation still held through this manager (Numba calls
  it when the context closes, after which those arrays are invalid) and gives
  cma's idle cache back.
This module imports without Numba; using the manager then raises an
ImportError that names Numba.
"""
import contextlib
import ctypes
import inspect
import threading

from cma import _lib

_INSTALL = ("cma.numba needs Numba's CUDA target: pip install numba-cuda (or numba); "
            "import failed with: %s")
_classes = {}


def _numba_cuda():
    try:
        from numba import cuda
        from numba.cuda.cudadrv import driver
    except ImportError as e:
        raise ImportError(_INSTALL % e, name="numba") from e
    return cuda, driver


def _device_pointer(driver, address):
    """The pointer object Numba's MemoryPointer expects: a CUdeviceptr under
    NVIDIA's cuda-python binding (numba-cuda's default), else a ctypes integer
    (classic Numba with its ctypes driver binding)."""
    if getattr(driver, "USE_NV_BINDING", True):
        binding = getattr(driver, "binding", None)
        if binding is None:
            from cuda.bindings import driver as binding
        return binding.CUdeviceptr(address)
    return ctypes.c_uint64(address)


def _free_all(addresses):
    """Frees every address; a failure is raised after the others are freed."""
    errors = []
    for address in addresses:
        try:
            _lib.free(address)
        except _lib.CmaError as e:
            errors.append(e)
    if errors:
        raise errors[0]


def _make_manager_class():
    cuda, driver = _numba_cuda()
    # numba-cuda dropped MemoryPointer's `context` argument in some releases
    # (it was never used); pass it only where the signature still has it.
    takes_context = "context" in inspect.signature(cuda.MemoryPointer).parameters
    memory_info = getattr(cuda, "MemoryInfo", None) or driver.MemoryInfo

    def memory_pointer(context, address, size, finalizer=None):
        head = [context] if takes_context else []
        return cuda.MemoryPointer(*head, _device_pointer(driver, address), size,
                                  finalizer=finalizer)

    class CmaNumbaManager(cuda.HostOnlyCUDAMemoryManager):
        """Numba EMM plugin over cma (see the module's contract)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # One lock for the live set and the deferral state: finalizers run
            # on whichever thread drops the last reference.
            self._mu = threading.Lock()
            self._live = {}  # address -> size, allocations not yet freed
            self._defer_depth = 0
            self._deferred = []  # addresses whose free waits for defer_cleanup's end

        @property
        def interface_version(self):
            return 1

        def initialize(self):
            # Creates cma's allocator now (from CMA_ALLOC_CONF/CMA_BACKEND, or
            # an earlier cma.init) so a bad configuration fails here, when
            # Numba sets up the context, not at the first array.
            _lib.stats(self._device())

        def _device(self):
            context = getattr(self, "context", None)
            if context is not None:
                return context.device.id
            return cuda.get_current_device().id  # Numba calls us in the context's thread

        def memalloc(self, size):
            if size == 0:
                return memory_pointer(self.context, 0, 0)
            address = _lib.malloc(size, self._device(), 0)
            with self._mu:
                self._live[address] = size
            return memory_pointer(self.context, address, size, self._finalizer(address))

        def _finalizer(self, address):
            def free():
                with self._mu:
                    if self._live.pop(address, None) is None:
                        return  # already freed by reset()
                    if self._defer_depth > 0:
                        self._deferred.append(address)
                        return
                _lib.free(address)
            return free

        @contextlib.contextmanager
        def defer_cleanup(self):
            # Numba's own deferral covers the host allocations it still manages.
            with super().defer_cleanup():
                with self._mu:
                    self._defer_depth += 1
                try:
                    yield
                finally:
                    with self._mu:
                        self._defer_depth -= 1
                        ready = self._deferred if self._defer_depth == 0 else []
                        if self._defer_depth == 0:
                            self._deferred = []
                    _free_all(ready)

        def pending_frees(self):
            """Allocations whose free waits for defer_cleanup() to end."""
            with self._mu:
                return len(self._deferred)

        def get_memory_info(self):
            s = _lib.stats(self._device())
            device_free, device_total = _lib.mem_info(self._device())
            total = s.get("managed_budget_bytes") or device_total
            allocated = s["allocated_bytes.all.current"]
            idle_cache = s["reserved_bytes.all.current"] - allocated
            free = max(0, min(total - allocated, device_free + max(0, idle_cache)))
            return memory_info(free=free, total=total)

        def get_ipc_handle(self, memory):
            raise RuntimeError(
                "cma.numba: get_ipc_handle is not supported: this memory is CUDA managed "
                "memory, which CUDA IPC (cuIpcGetMemHandle) cannot export; share memory "
                "between processes with cma.symmetric instead")

        def reset(self):
            super().reset()
            with self._mu:
                addresses = list(self._live) + self._deferred
                self._live.clear()
                self._deferred = []
            _free_all(addresses)
            _lib.empty_cache()

    return CmaNumbaManager


def manager_class():
    """The plugin class (built on first use, so that importing cma.numba does
    not need Numba)."""
    if "manager" not in _classes:
        _classes["manager"] = _make_manager_class()
    return _classes["manager"]


def use():
    """Makes cma Numba's memory manager for this process. Call it before
    Numba creates a CUDA context (Numba cannot change managers afterwards)."""
    cuda, _ = _numba_cuda()
    cuda.set_memory_manager(manager_class())


def __getattr__(name):
    # NUMBA_CUDA_MEMORY_MANAGER=cma.numba makes Numba read this attribute.
    if name in ("CmaNumbaManager", "_numba_memory_manager"):
        return manager_class()
    raise AttributeError(f"module 'cma.numba' has no attribute {name!r}")
