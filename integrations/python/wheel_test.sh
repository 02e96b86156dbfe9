#!/usr/bin/env bash
# The wheel as a user gets it: //:wheel installed with pip (offline, --no-index)
# into a fresh virtual environment of Debian's python3, then imported and the
# host-backend Python tests run against the installed copy, from a folder with
# no cma package in it, with no PYTHONPATH or CMA_LIBRARY. Also checks the
# wheel itself (name and tag, RECORD hashes, the files it must carry) and that
# the installed libcma.so finds every bundled library beside itself.
set -euo pipefail
runfiles="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:-cma}"
wheel=$(ls "$runfiles"/cma_wheel/caching_managed_allocator-*-py3-none-linux_x86_64.whl)
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/wheel.XXXXXX")"
unset PYTHONPATH CMA_LIBRARY
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HOME="$tmp"
# Debian's interpreter, as the other Python tests (third_party/BUILD): it has
# python3-venv, pytest, numpy and numba.
py=/usr/bin/python3

echo "== the wheel's contents and RECORD"
"$py" - "$wheel" <<'PY'
import base64, csv, hashlib, io, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = set(z.namelist())
info = [n for n in names if n.endswith(".dist-info/RECORD")]
assert len(info) == 1, info
dist_info = info[0].rsplit("/", 1)[0]
wheel = z.read(dist_info + "/WHEEL").decode()
assert "Tag: py3-none-linux_x86_64" in wheel and "Root-Is-Purelib: false" in wheel, wheel
rows = list(csv.reader(io.StringIO(z.read(info[0]).decode())))
recorded = {r[0] for r in rows}
assert recorded == names, ("RECORD and archive differ", recorded ^ names)
for name, digest, size in rows:
    if name == info[0]:
        assert digest == "" and size == "", (name, digest)
        continue
    data = z.read(name)
    want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert digest == want and int(size) == len(data), ("bad RECORD entry", name)
for must in ("cma/__init__.py", "cma/_lib.py", "cma/_torch_start.py", "cma_torch.pth",
             "cma/torch/__init__.py", "cma/torch/__main__.py", "cma/torch/_ext/build.py",
             "cma/torch/_ext/cuda_allocator.cc", "cma/torch/_ext/history.cc",
             "cma/torch/_ext/cuda_allocator.h", "cma/torch/_ext/capture_watch.cc",
             "cma/torch/_ext/capture_watch.h", "cma/torch/_ext/cpu_allocator.cc",
             "cma/torch/training/step_in_backward.py", "cma/torch/distributed.py",
             "cma/cupy.py", "cma/numba.py", "cma/symmetric.py", "cma/libcma.so",
             "cma/include/cma_c.h"):
    assert must in names, must
absl = [n for n in names if n.startswith("cma/libabsl_")]
assert len(absl) > 10, absl
print(len(names), "files,", len(absl), "Abseil libraries, RECORD verified")
PY

echo "== pip install --no-index into a fresh venv"
"$py" -m venv --system-site-packages "$tmp/venv"
vpy="$tmp/venv/bin/python"
"$vpy" -m pip install -q --no-index "$wheel"
mkdir "$tmp/work" && cd "$tmp/work"
site=$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")

echo "== import from the installed package"
"$vpy" - "$site" <<'PY'
import os, sys
site = sys.argv[1]
import importlib.util
import cma, cma.numba, cma.symmetric
pkg = os.path.join(site, "cma")
# cma/torch/_ext/build.py alone: importing it through cma.torch needs torch.
spec = importlib.util.spec_from_file_location("build", os.path.join(pkg, "torch", "_ext", "build.py"))
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
assert os.path.exists(os.path.join(build._HERE, "cuda_allocator.cc")), build._HERE
assert build._header_dir() == os.path.join(site, "cma", "include")
assert os.path.dirname(cma.__file__) == pkg, cma.__file__
assert cma.library_path() == os.path.join(pkg, "libcma.so"), cma.library_path()
cma.init("", backend="host")
p = cma.malloc(1 << 20)
cma.free(p)
try:
    import cma.torch  # noqa: F401  (torch is not installed on the CI machine)
except ModuleNotFoundError as e:
    assert e.name == "torch", e  # cma.torch itself is there; only torch is missing
print("imported", cma.__file__, "library", cma.library_path())
PY

echo "== cma_torch.pth: CMA_TORCH set, a hook waits for torch; unset, nothing is imported"
[[ -f $site/cma_torch.pth ]] || { echo "FAIL: cma_torch.pth is not in site-packages"; exit 1; }
CMA_TORCH=1 "$vpy" -c "
import sys
assert [type(f).__name__ for f in sys.meta_path if type(f).__module__ == 'cma._torch_start'] == ['_Hook'], sys.meta_path"
env -u CMA_TORCH "$vpy" -c "
import sys
assert 'cma' not in sys.modules and 'cma._torch_start' not in sys.modules, sorted(sys.modules)"

echo "== the installed libcma.so resolves its libraries beside itself"
ldd "$site/cma/libcma.so" | awk '/libabsl|libsodium/' > "$tmp/ldd.txt"
[[ -s $tmp/ldd.txt ]] || { echo "FAIL: ldd lists no bundled library"; exit 1; }
if grep -v "=> $site/cma/" "$tmp/ldd.txt"; then
  echo "FAIL: the libraries above are not taken from the installed package"; exit 1
fi
grep -q "not found" "$tmp/ldd.txt" && { echo "FAIL: unresolved libraries"; exit 1; }

echo "== CMA_LIBRARY overrides the bundled library"
CMA_LIBRARY="$runfiles/integrations/c/libcma.so" "$vpy" -c "
import os, cma
assert cma.library_path() == os.path.abspath(os.environ['CMA_LIBRARY']), cma.library_path()"
CMA_LIBRARY=/nonexistent/libcma.so "$vpy" -c "
import cma
try:
    cma.library_path()
except cma.CmaError as e:
    assert 'CMA_LIBRARY=/nonexistent/libcma.so does not exist' in str(e), e
else:
    raise AssertionError('a missing CMA_LIBRARY was ignored')"

echo "== host-backend Python tests against the installed copy"
mkdir "$tmp/tests"
cp "$runfiles"/integrations/python/{cma_test,symmetric_test,numba_test}.py "$tmp/tests/"
# Every test session first proves it imports the installed cma, not a copy
# of the repository's.
cat > "$tmp/tests/conftest.py" <<PY
import os
import cma
assert os.path.dirname(cma.__file__) == os.path.join("$site", "cma"), cma.__file__
PY
"$vpy" -m pytest -q -p no:cacheprovider ${XML_OUTPUT_FILE:+--junitxml="$XML_OUTPUT_FILE"} \
  "$tmp/tests"
echo "PASS"
