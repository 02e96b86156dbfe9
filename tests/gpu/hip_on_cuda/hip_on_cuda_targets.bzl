"""hip_on_cuda: a test-only libamdhip64.so that forwards the HIP runtime entry
points backends/hip uses to the CUDA runtime, so that the HIP backend runs on
an NVIDIA GPU. Declared only where both a CUDA toolkit and HIP headers were
found (see //third_party:system_libs.bzl)."""

load("@local_cuda//:defs.bzl", "CUDA_FOUND")
load("@local_hip//:defs.bzl", "HIP_FOUND")

def hip_on_cuda_targets():
    if not (CUDA_FOUND and HIP_FOUND):
        return

    # HIP's headers and CUDA's cannot share a translation unit (both define
    # the vector types), so each half sees only its own vendor's headers.
    native.cc_library(
        name = "hip_exports",
        testonly = True,
        srcs = ["hip_exports.cc"],
        hdrs = ["bridge.h"],
        deps = ["@local_hip//:hip_headers"],
        alwayslink = True,
    )

    native.cc_library(
        name = "cuda_bridge",
        testonly = True,
        srcs = ["cuda_bridge.cc"],
        hdrs = ["bridge.h"],
        deps = ["@local_cuda//:cudart_static"],
        alwayslink = True,
    )

    # Point the HIP backend at it with CMA_HIP_LIBRARY=<path of this file>.
    native.cc_binary(
        name = "libamdhip64.so",
        testonly = True,
        linkshared = True,
        additional_linker_inputs = ["exports.lds"],
        linkopts = [
            "-Wl,--version-script=$(location exports.lds)",
            "-Wl,-soname,libamdhip64.so",
        ],
        deps = [":cuda_bridge", ":hip_exports"],
    )

    # Runs everywhere both exist: without a GPU it checks the library and the
    # reason; on an NVIDIA GPU the HIP backend end to end.
    native.cc_test(
        name = "hip_on_cuda_test",
        srcs = ["hip_on_cuda_test.cc"],
        data = [":libamdhip64.so"],
        linkstatic = True,
        deps = [
            "//allocator",
            "//backends/hip",
            "@system//:gtest_main",
        ],
    )
