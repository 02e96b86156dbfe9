"""Repository rules that wrap Debian's system libraries and an optional CUDA
toolkit, so that Bazel 4.2.3 builds fully offline.

Abseil, GoogleTest and Google Benchmark are linked from their static archives
so that binaries built on Debian also run on the GPU machine, which has none
of them installed."""

_ABSL_LIBS = [
    "flags_parse", "flags_usage", "flags_usage_internal", "flags_internal",
    "flags_marshalling", "flags_reflection", "flags_config",
    "flags_private_handle_accessor", "flags_commandlineflag",
    "flags_commandlineflag_internal", "flags_program_name",
    "statusor", "status", "cord", "cordz_info", "cord_internal",
    "cordz_functions", "cordz_handle", "cordz_sample_token",
    "exponential_biased", "synchronization", "graphcycles_internal",
    "stacktrace", "symbolize", "debugging_internal", "demangle_internal",
    "malloc_internal", "time", "civil_time", "time_zone", "str_format_internal",
    "strings", "strings_internal", "int128", "hash", "city", "low_level_hash",
    "raw_hash_set", "hashtablez_sampler", "bad_optional_access",
    "bad_variant_access", "throw_delegate", "base", "spinlock_wait",
    "raw_logging_internal", "log_severity", "strerror",
    "random_distributions", "random_seed_sequences",
    "random_internal_pool_urbg", "random_internal_randen",
    "random_internal_randen_hwaes", "random_internal_randen_hwaes_impl",
    "random_internal_randen_slow", "random_internal_platform",
    "random_internal_seed_material", "random_seed_gen_exception",
]

def _find_libdir(ctx):
    for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib"]:
        if ctx.path(d + "/libabsl_base.a").exists:
            return d
    fail("Abseil static libraries not found; install libabsl-dev (./bazelw does this as root)")

def _system_libs_impl(ctx):
    libdir = _find_libdir(ctx)
    absl = ["%s/libabsl_%s.a" % (libdir, n) for n in _ABSL_LIBS]
    absl = [a for a in absl if ctx.path(a).exists]
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    if not ctx.path(libdir + "/libsodium.a").exists or not ctx.path("/usr/include/sodium.h").exists:
        fail("libsodium's static library and headers not found; install libsodium-dev (./bazelw does this as root)")

    # Debian's OpenMPI, for the MPI exchange of the symmetric mode.
    mpi_include = libdir + "/openmpi/include"
    mpi_found = ctx.path(mpi_include + "/mpi.h").exists
    if mpi_found:
        ctx.symlink(mpi_include, "mpi_include")
    ctx.file("defs.bzl", "MPI_FOUND = %s\n" % mpi_found)
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])

cc_library(
    name = "mpi",
    hdrs = glob(["mpi_include/**/*.h"]),
    includes = ["mpi_include"],
    # The C API only: no MPI C++ bindings.
    defines = ["OMPI_SKIP_MPICXX", "MPICH_SKIP_MPICXX"],
    linkopts = ["-L{d}/openmpi/lib", "-lmpi"],
)

# Libraries depend on :absl and :sodium (headers, from /usr/include); each
# final binary picks how Abseil and libsodium (the HMAC of the symmetric
# rendezvous) are linked: :absl_static for tests and tools, so they run on
# machines without them; :absl_shared for shared libraries, because
# Debian's archives are not position-independent.
cc_library(name = "absl")

cc_library(name = "sodium")

cc_library(
    name = "absl_static",
    linkopts = ["-Wl,--start-group"] + {absl} + ["-Wl,--end-group", "{d}/libsodium.a", "-lpthread"],
)

cc_library(
    name = "absl_shared",
    linkopts = ["-L{d}"] + {absl_shared} + ["-lsodium", "-lpthread"],
)

cc_library(
    name = "gtest",
    linkopts = ["{d}/libgmock.a", "{d}/libgtest.a", "-lpthread"],
    deps = [":absl_static"],
)

cc_library(
    name = "gtest_main",
    linkopts = ["{d}/libgmock_main.a"],
    deps = [":gtest"],
)

cc_library(
    name = "benchmark",
    linkopts = ["{d}/libbenchmark.a"] if {has_bench_a} else ["-lbenchmark"],
)

cc_library(
    name = "zlib",
    linkopts = ["-lz"],
)
""".format(absl = repr(absl), d = libdir,
           absl_shared = repr(["-l" + a.split("/lib")[-1][:-2] for a in absl]),
           has_bench_a = ctx.path(libdir + "/libbenchmark.a").exists))

system_libs = repository_rule(implementation = _system_libs_impl, local = True)

def _cuda_configure_impl(ctx):
    root = ctx.os.environ.get("CUDA_PATH", "") or "/usr/local/cuda"
    found = (ctx.path(root + "/include/cuda_runtime.h").exists and
             ctx.path(root + "/lib64/libcudart_static.a").exists)
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.file("defs.bzl", "CUDA_FOUND = %s\nCUDA_ROOT = %r\n" % (found, root if found else ""))
    if not found:
        ctx.file("BUILD", 'package(default_visibility = ["//visibility:public"])\n' +
                          'cc_library(name = "cudart_static")\nexports_files(["defs.bzl"])\n')
        return
    ctx.symlink(root + "/include", "include")
    ctx.symlink(root + "/bin", "bin")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])

cc_library(
    name = "cudart_static",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp"]),
    includes = ["include"],
    linkopts = ["{root}/lib64/libcudart_static.a", "-ldl", "-lpthread", "-lrt"],
)

filegroup(name = "nvcc", srcs = ["bin/nvcc"])
""".format(root = root))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)

def _hip_configure_impl(ctx):
    roots = [ctx.os.environ.get("ROCM_PATH", ""), "/opt/rocm", "/usr"]
    root = ""
    for r in roots:
        if r and ctx.path(r + "/include/hip/hip_runtime_api.h").exists:
            root = r
            break
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)
    ctx.file("defs.bzl", "HIP_FOUND = %s\nHIP_ROOT = %r\n" % (root != "", root))
    if not root:
        ctx.file("BUILD", 'package(default_visibility = ["//visibility:public"])\n' +
                          'cc_library(name = "hip_headers")\nexports_files(["defs.bzl"])\n')
        return

    # Only the hip/ headers: the rest of the root (e.g. /usr/include) must not
    # shadow the system's own headers.
    ctx.symlink(root + "/include/hip", "include/hip")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])
exports_files(["defs.bzl"])

# Headers only: the runtime (libamdhip64) is loaded with dlopen at run time.
cc_library(
    name = "hip_headers",
    hdrs = glob(["include/hip/**"]),
    includes = ["include"],
    defines = ["__HIP_PLATFORM_AMD__"],
    linkopts = ["-ldl"],
)
""")

hip_configure = repository_rule(
    implementation = _hip_configure_impl,
    environ = ["ROCM_PATH"],
    local = True,
)
