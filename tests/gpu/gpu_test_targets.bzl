"""GPU-only test targets, declared only where a CUDA toolkit was found."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND")

def gpu_test_targets():
    if not CUDA_FOUND:
        return
    native.cc_test(
        name = "cuda_gpu_test",
        srcs = ["cuda_gpu_test.cc"],
        linkstatic = True,
        deps = [
            "//allocator",
            "//backends/cuda",
            "//backends:registry",
            "//bench/cuda:kernels",
            "@system//:gtest_main",
        ],
    )

    native.cc_test(
        name = "cuda_symmetric_test",
        srcs = ["cuda_symmetric_test.cc"],
        linkstatic = True,
        deps = [
            "//allocator/symmetric",
            "//backends/cuda",
            "//bench/cuda:kernels",
            "@system//:gtest",
        ],
    )
