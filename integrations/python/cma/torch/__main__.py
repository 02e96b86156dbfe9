"""python -m cma.torch [--conf CMA_ALLOC_CONF] script.py args... (or -m module
args...): cma is PyTorch's allocator before the unchanged script runs
(cma/_torch_start.py)."""
import sys

from cma import _torch_start

if __name__ == "__main__":
    sys.exit(_torch_start.main())
