"""Builds the cma wheel (run by the //:wheel genrule; no rules_python here).

Contract: writes one platform wheel, tag py3-none-linux_x86_64, holding
  cma/**.py                     the Python package (pure ctypes, no CPython
                                extension: any Python 3 of the platform loads it)
  cma/torch/_ext/*.cc, *.h      C++ sources compiled on the user's machine on first
                                use (cma.torch's allocators, against the installed torch)
  cma_torch.pth                 --pth: site-packages' startup line that makes cma
                                PyTorch's allocator where CMA_TORCH is set
                                (cma/_torch_start.py)
  cma/libcma.so                 the C ABI
  cma/lib*.so.N                 every shared library `ldd libcma.so` resolves
                                whose name starts with one of --bundle's
                                prefixes (Debian's Abseil, libsodium), found
                                by libcma.so through its RUNPATH $ORIGIN
  cma/include/cma_c.h           the C header, for C users of the bundled library
  <dist>.dist-info/{METADATA,WHEEL,RECORD}
RECORD carries a sha256 for every file. Entries are sorted and dated 1980-01-01,
so the same inputs give the same bytes. Fails (no wheel) when libcma.so has no
$ORIGIN run path, when a bundled library does not resolve, or when any shipped
library needs a newer glibc/libstdc++ than --max_glibc/--max_glibcxx (the
oldest machine the wheel is meant for).
"""
import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile

_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: reproducible bytes


def _run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def bundled_libraries(lib, prefixes):
    """(soname, path) for each library ldd resolves for `lib` whose soname
    starts with one of `prefixes`."""
    found = []
    for line in _run("ldd", lib).splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if not m or not m.group(1).startswith(tuple(prefixes)):
            continue
        if m.group(2) == "not":
            sys.exit(f"build_wheel: {m.group(1)} (needed by libcma.so) is not found")
        found.append((m.group(1), m.group(2)))
    return found


def _version_tuple(text):
    return tuple(int(x) for x in text.split("."))


def check_symbol_versions(path, caps):
    """Exits if `path` needs a symbol version above its cap, e.g. GLIBC_2.38
    with a cap of 2.36: the wheel would not load on the machines it is for."""
    needed = set(re.findall(r"\b(GLIBC|GLIBCXX)_([0-9.]+)\b", _run("objdump", "-T", path)))
    for family, version in sorted(needed):
        cap = caps.get(family)
        if cap and _version_tuple(version) > _version_tuple(cap):
            sys.exit(f"build_wheel: {os.path.basename(path)} needs {family}_{version}, "
                     f"newer than {family}_{cap} (--max_{family.lower()})")


def check_runpath(lib):
    dynamic = _run("readelf", "-d", lib)
    if not re.search(r"\((?:RUNPATH|RPATH)\).*\$ORIGIN", dynamic):
        sys.exit("build_wheel: libcma.so has no $ORIGIN run path: it would not find the "
                 "libraries bundled beside it")


def package_path(src):
    """The archive name of a package source: its path from the last folder
    named cma (.../integrations/python/cma/torch/x.py -> cma/torch/x.py),
    or None for a file outside the package."""
    parts = os.path.normpath(src).split(os.sep)
    folders = [i for i, p in enumerate(parts[:-1]) if p == "cma"]
    return "/".join(parts[folders[-1]:]) if folders else None


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(out, files, dist, version, tag):
    """files: {archive name: (bytes, mode)}."""
    info = f"{dist}-{version}.dist-info"
    metadata = (f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n"
                "Summary: caching_managed_allocator: a caching allocator for GPU managed and "
                "symmetric memory (PyTorch, CuPy, Numba)\n"
                "Requires-Python: >=3.8\n"
                "Description-Content-Type: text/plain\n\n"
                "import cma.torch / cma.cupy / cma.numba; libcma.so and the shared libraries it "
                "needs are inside the package.\n")
    wheel = (f"Wheel-Version: 1.0\nGenerator: cma build_wheel.py\nRoot-Is-Purelib: false\n"
             f"Tag: {tag}\n")
    files = dict(files)
    files[f"{info}/METADATA"] = (metadata.encode(), 0o644)
    files[f"{info}/WHEEL"] = (wheel.encode(), 0o644)
    record_name = f"{info}/RECORD"
    record = "".join(f"{name},{_digest(data)},{len(data)}\n"
                     for name, (data, _) in sorted(files.items()))
    record += f"{record_name},,\n"  # a RECORD cannot hash itself
    files[record_name] = (record.encode(), 0o644)
    tmp = out + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        # RECORD last, as the wheel spec recommends.
        for name in sorted(files, key=lambda n: (n == record_name, n)):
            data, mode = files[name]
            entry = zipfile.ZipInfo(name, _DATE)
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    os.replace(tmp, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the .whl to write")
    ap.add_argument("--dist", required=True, help="distribution name, underscores")
    ap.add_argument("--version", required=True)
    ap.add_argument("--tag", default="py3-none-linux_x86_64")
    ap.add_argument("--lib", required=True, help="libcma.so")
    ap.add_argument("--header", required=True, help="cma_c.h")
    ap.add_argument("--bundle", default="libabsl,libsodium",
                    help="comma-separated soname prefixes of the libraries to ship")
    ap.add_argument("--max_glibc", default="2.36")
    ap.add_argument("--max_glibcxx", default="3.4.30")
    ap.add_argument("--pth", default="", help="a .pth file for the wheel's root (site-packages)")
    ap.add_argument("sources", nargs="+", help="the package's .py, .cc and .h files (cma/...)")
    a = ap.parse_args()

    expected = f"{a.dist}-{a.version}-{a.tag}.whl"
    if os.path.basename(a.out) != expected:  # pip reads the tag from the file name
        sys.exit(f"build_wheel: --out must be named {expected}")
    check_runpath(a.lib)
    caps = {"GLIBC": a.max_glibc, "GLIBCXX": a.max_glibcxx}
    files = {}
    for src in a.sources:
        name = package_path(src)
        if name is None or not src.endswith((".py", ".cc", ".h")):
            sys.exit(f"build_wheel: {src} is not a module of the cma package")
        with open(src, "rb") as f:
            files[name] = (f.read(), 0o644)
    if a.pth:
        if not a.pth.endswith(".pth"):
            sys.exit(f"build_wheel: --pth {a.pth} is not a .pth file")
        with open(a.pth, "rb") as f:
            files[os.path.basename(a.pth)] = (f.read(), 0o644)
    libs = [("libcma.so", a.lib)] + bundled_libraries(a.lib, a.bundle.split(","))
    for soname, path in libs:
        check_symbol_versions(path, caps)
        with open(path, "rb") as f:
            files["cma/" + soname] = (f.read(), 0o755)
    with open(a.header, "rb") as f:
        files["cma/include/cma_c.h"] = (f.read(), 0o644)
    write_wheel(a.out, files, a.dist, a.version, a.tag)
    print(f"build_wheel: {expected}: {len(a.sources)} sources, {len(libs)} libraries")


if __name__ == "__main__":
    main()
