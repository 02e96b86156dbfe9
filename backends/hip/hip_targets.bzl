"""The HIP backend's targets, declared only where HIP headers were found
(see //third_party:system_libs.bzl), so that //... builds everywhere."""

load("@local_hip//:defs.bzl", "HIP_FOUND")

def hip_targets():
    if not HIP_FOUND:
        return
    native.cc_library(
        name = "hip",
        srcs = [
            "hip_api.cc",
            "hip_backend.cc",
            "hip_managed_rules.cc",
            "hip_status.cc",
        ],
        hdrs = [
            "hip_api.h",
            "hip_backend.h",
            "hip_managed_rules.h",
            "hip_status.h",
        ],
        deps = [
            "//backends:backend",
            "@local_hip//:hip_headers",
            "@system//:absl",
        ],
    )

    # Without an AMD GPU (or without libamdhip64) the tests that need one
    # skip with the reason.
    native.cc_test(
        name = "hip_backend_test",
        srcs = ["hip_backend_test.cc"],
        linkstatic = True,
        deps = [
            ":hip",
            "@system//:gtest_main",
        ],
    )

    # ROCm's managed-memory rules, pure: run everywhere HIP headers exist.
    native.cc_test(
        name = "hip_managed_rules_test",
        srcs = ["hip_managed_rules_test.cc"],
        linkstatic = True,
        deps = [
            ":hip",
            "@system//:gtest_main",
        ],
    )
