"""CuPy route: cma.cupy.use() sends CuPy's allocations to this allocator,
ordered on CuPy's current stream."""
import cupy

from cma import _lib


def _malloc(size, device_id):
    return _lib.malloc(size, device_id, cupy.cuda.get_current_stream().ptr)


def _free(ptr, device_id):
    _lib.free(ptr)


def use():
    """Makes this allocator CuPy's device allocator for the process."""
    allocator = cupy.cuda.memory.PythonFunctionAllocator(_malloc, _free)
    cupy.cuda.set_allocator(allocator.malloc)
    return allocator
