"""The CUDA backend's targets, declared only where a CUDA toolkit was found
(see //third_party:system_libs.bzl), so that //... builds everywhere."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND", "CUDA_ROOT")

def cuda_targets():
    if not CUDA_FOUND:
        return
    native.cc_library(
        name = "cuda",
        srcs = [
            "cuda_backend.cc",
            "cuda_status.cc",
            "driver_api.cc",
        ],
        hdrs = [
            "cuda_backend.h",
            "cuda_status.h",
            "driver_api.h",
        ],
        deps = [
            "//backends:backend",
            "@local_cuda//:cudart_static",
            "@system//:absl",
        ],
    )

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
            ":cuda",
            ":kernels",
            "//allocator",
            "@local_cuda//:cudart_static",
            "@system//:absl",
        ],
    )

    # GPU-only tests with real kernels (vendor code stays in backends/). Without a
    # visible device every test skips with the runtime's reason. Linked statically
    # so the -c opt binary runs on a GPU machine as it is.
    native.cc_test(
        name = "cuda_gpu_test",
        srcs = ["cuda_gpu_test.cc"],
        linkstatic = True,
        deps = [
            ":cuda",
            ":kernels",
            "//allocator",
            "@system//:gtest_main",
        ],
    )

    native.cc_test(
        name = "cuda_symmetric_test",
        srcs = ["cuda_symmetric_test.cc"],
        linkstatic = True,
        deps = [
            ":cuda",
            ":kernels",
            "//allocator/symmetric",
            "@system//:gtest",
        ],
    )
