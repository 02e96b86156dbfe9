"""cma's c10 glue: the C++ allocators (CUDA and CPU), history, capture
watch, compiled against the installed torch by build.py."""
