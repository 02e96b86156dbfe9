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
            "cuda_capture.cc",
            "cuda_managed.cc",
            "cuda_pinned.cc",
            "cuda_shmem.cc",
            "cuda_status.cc",
            "cuda_streams.cc",
            "cuda_vmm.cc",
            "driver_api.cc",
            "nvshmem_api.cc",
        ],
        hdrs = [
            "cuda_backend.h",
            "cuda_backend_internal.h",
            "cuda_capture.h",
            "cuda_pinned.h",
            "cuda_shmem.h",
            "cuda_status.h",
            "driver_api.h",
            "nvshmem_api.h",
        ],
        deps = [
            ":nccl_api",
            "//backends:backend",
            "@local_cuda//:cudart_static",
            "@system//:absl",
        ],
        # dlopen, for NCCL (nccl_api.h) and NVSHMEM's host library (nvshmem_api.h).
        linkopts = ["-ldl"],
    )
