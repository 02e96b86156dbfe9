"""Builds and installs cma as PyTorch's CUDA allocator (cuda_allocator.h).

The allocator is a C++ subclass of PyTorch's c10 CUDAAllocator, so it needs
PyTorch's headers and C++ ABI: it is compiled against the installed torch on
first use with torch.utils.cpp_extension (cached in TORCH_EXTENSIONS_DIR like
any extension, rebuilt when torch or the source changes). That needs a C++
compiler and the CUDA toolkit's headers (CUDA_HOME); without them install()
raises an error saying so.
"""
import os

_module = None

_HERE = os.path.dirname(os.path.abspath(__file__))  # cma/torch/_ext
_PACKAGE = os.path.dirname(os.path.dirname(_HERE))  # cma


def _header_dir():
    """Where cma_c.h is: inside the package (wheel, GPU bundle) or the repo."""
    for d in (os.path.join(_PACKAGE, "include"),
              os.path.join(_PACKAGE, "..", "..", "c")):
        if os.path.exists(os.path.join(d, "cma_c.h")):
            return os.path.abspath(d)
    raise RuntimeError("cma.torch: cma_c.h not found beside the cma package "
                       f"({_PACKAGE}/include); reinstall the cma wheel")


def build():
    """The compiled extension module (built on first call)."""
    global _module
    if _module is None:
        from torch.utils import cpp_extension
        try:
            _module = cpp_extension.load(
                name="cma_torch_allocator",
                sources=[os.path.join(_HERE, name) for name in (
                    "cuda_allocator.cc", "history.cc", "capture_watch.cc", "cpu_allocator.cc")],
                extra_include_paths=[_header_dir()],
                extra_cflags=["-O2"], with_cuda=True, verbose=False)
        except Exception as e:  # noqa: BLE001 - re-raised with what is missing
            raise RuntimeError(
                "cma.torch: could not compile cma's PyTorch allocator against the installed "
                "torch (it needs a C++ compiler and the CUDA toolkit headers, found through "
                f"CUDA_HOME={os.environ.get('CUDA_HOME', '(unset)')}): {e}") from e
    return _module


def install(library_path):
    """Makes cma PyTorch's CUDA allocator for the whole process."""
    build().install(library_path)
