"""GPU-only benchmark targets and the test kernels, declared only where a CUDA
toolkit was found (see //third_party:system_libs.bzl)."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_ROOT")

def cuda_bench_targets():
    if not CUDA_FOUND:
        return

    # Device code: nvcc compiles it to a position-independent object for
    # Hopper (sm_90) and Ampere (sm_80) with PTX for newer chips.
    native.genrule(
        name = "kernels_obj",
        srcs = ["kernels.cu", "kernels.h", "//backends:backend.h"],
        outs = ["kernels.o"],
        cmd = ("%s/bin/nvcc -O3 -std=c++17 -Xcompiler -fPIC -I. -I$(GENDIR) " % CUDA_ROOT +
               "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 " +
               "-gencode arch=compute_90,code=compute_90 -c $(location kernels.cu) -o $@"),
        local = True,
    )

    # Fill/verify/peer-write kernels shared by the GPU benchmarks and tests/gpu.
    native.cc_library(
        name = "kernels",
        srcs = [":kernels_obj"],
        hdrs = ["kernels.h"],
        deps = [
            "//backends:backend",
            "@local_cuda//:cudart_static",
            "@system//:absl",
        ],
    )

    native.cc_library(
        name = "cuda_bench",
        srcs = ["cuda_bench.cc", "cuda_migration_bench.cc"],
        hdrs = ["cuda_bench.h"],
        deps = [
            ":kernels",
            "//allocator",
            "//backends/cuda",
            "@local_cuda//:cudart_static",
            "@system//:absl",
        ],
    )

    # The link's bandwidth each way and both at once (issue 48), whose JSON
    # bench/link_limit reads; how fast a live allocation's pages leave for
    # the host and come back (issue 48: the away state's transport).
    _cuda_main("link_duplex_bench")
    _cuda_main("away_transport_bench")

    # Whether a discard's late driver work reaches pages written right after
    # it (issue 48: the learned step's losses changed with discards on).
    _cuda_main("late_discard_probe")

def _cuda_main(name):
    """A GPU-only program: one .cu with its main, compiled by nvcc for Hopper
    and Ampere (PTX for newer chips), linked with the static cudart."""
    native.genrule(
        name = name + "_obj",
        srcs = [name + ".cu"],
        outs = [name + ".o"],
        cmd = ("%s/bin/nvcc -O3 -std=c++17 -Xcompiler -fPIC " % CUDA_ROOT +
               "-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 " +
               "-gencode arch=compute_90,code=compute_90 -c $(location %s.cu) -o $@" % name),
        local = True,
    )
    native.cc_binary(
        name = name,
        srcs = [":" + name + "_obj"],
        deps = ["@local_cuda//:cudart_static"],
    )
