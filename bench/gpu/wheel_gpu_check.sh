#!/usr/bin/env bash
# The wheel built by `./bazelw build -c opt //:wheel`, proven on a GPU machine
# (no network needed): installs it into a fresh virtual environment that sees
# the machine's torch, CuPy and numba-cuda, then runs the PyTorch route suite
# (integrations/python/gpu/torch_gpu_test.py) and the Numba GPU test against
# the installed copy: no PYTHONPATH, no CMA_LIBRARY, the test scripts copied
# to a folder with no cma package beside them, the PyTorch shim compiled
# afresh from the installed package.
#   bench/gpu/wheel_gpu_check.sh WHEEL OUTDIR [GPU_TESTS_DIR]
# GPU_TESTS_DIR: the folder of torch_gpu_test.py and its route scripts
# (default: py/gpu beside this script in a package.sh folder, else
# integrations/python/gpu of this checkout). Results in OUTDIR: env.txt (wheel hash, interpreter, which
# cma was imported), ldd.txt (how libcma.so's libraries resolve), torch.txt/numba.txt
# (pytest output), torch_routes.json/numba.json, summary.txt. Exit status 0
# only if both suites pass and the installed copy was the one tested.
set -uo pipefail
wheel="$(readlink -f "${1:?usage: wheel_gpu_check.sh WHEEL OUTDIR [GPU_TESTS_DIR]}")"
mkdir -p "${2:?usage: wheel_gpu_check.sh WHEEL OUTDIR [GPU_TESTS_DIR]}" && out="$(readlink -f "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
default_tests="$here/../../integrations/python/gpu"
[[ -d $here/py/gpu ]] && default_tests="$here/py/gpu"  # run from a package.sh folder
tests="$(readlink -f "${3:-$default_tests}")"
python="${PYTHON:-python3}"
work="$(mktemp -d /tmp/cma_wheel_check.XXXXXX)"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH CMA_LIBRARY
export PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Never multicast on the shared machine (as run_all.sh).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1 TORCH_EXTENSIONS_DIR="$work/torch_extensions"
die() { echo "wheel_gpu_check: $*" | tee -a "$out/summary.txt" >&2; exit 1; }
: > "$out/summary.txt"
[[ -f $wheel ]] || die "no wheel at $1"
[[ -f $tests/torch_gpu_test.py && -f $tests/numba_gpu_test.py ]] || die "no GPU tests in $tests"

# The venv; if this python3's ensurepip is missing (Ubuntu without
# python3-venv), a venv without pip and the system pip installing into it.
venv="$work/venv"
if "$python" -m venv --system-site-packages "$venv" 2> "$work/venv.err"; then
  "$venv/bin/python" -m pip install -q --no-index --no-deps "$wheel" || die "pip install failed"
else
  cat "$work/venv.err" >&2
  "$python" -m venv --system-site-packages --without-pip "$venv" || die "cannot create a venv"
  "$python" -m pip --python "$venv/bin/python" install -q --no-index --no-deps "$wheel" \
    || die "pip install (system pip into the venv) failed"
fi
vpy="$venv/bin/python"
site="$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['platlib'])")"
# torch/CuPy/numba-cuda may live in an environment that --system-site-packages
# does not reach (python3 itself a venv): add its site folders after the
# venv's own, so the installed cma still comes first.
if ! "$vpy" -c "import torch, cupy, numba.cuda" 2>/dev/null; then
  "$python" -c "import site, sys; print('\n'.join(p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))))" \
    > "$site/zz_system_site.pth"
  "$vpy" -c "import torch, cupy, numba.cuda" || die "torch, cupy and numba-cuda must import"
fi

# The tests, away from any cma package: their sys.path insert of '..' finds none.
mkdir -p "$work/run/gpu" && cp "$tests"/*.py "$work/run/gpu/"
cd "$work/run/gpu"
{
  date -u
  echo "wheel: $wheel"; sha256sum "$wheel"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  "$vpy" - "$site" <<'PY'
import os, sys
sys.path.insert(0, "..")  # as the GPU test scripts do
import cma, numba, torch, cupy
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cupy", cupy.__version__, "numba", numba.__version__)
print("cma imported from", cma.__file__)
print("libcma.so", cma.library_path())
assert os.path.dirname(cma.__file__) == os.path.join(sys.argv[1], "cma"), "not the installed cma"
assert os.path.dirname(cma.library_path()) == os.path.join(sys.argv[1], "cma"), "not its library"
print("INSTALLED_COPY_OK")
PY
} > "$out/env.txt" 2>&1
ldd "$site/cma/libcma.so" > "$out/ldd.txt" 2>&1
echo "libraries resolved inside the package: $(grep -c "=> $site/cma/" "$out/ldd.txt")" \
  >> "$out/env.txt"
cat "$out/env.txt"
grep -q INSTALLED_COPY_OK "$out/env.txt" || die "the installed copy is not what the tests import"
grep -q "=> not found" "$out/ldd.txt" && die "libcma.so has unresolved libraries (ldd.txt)"
if grep -E "absl|sodium" "$out/ldd.txt" | grep -v "=> $site/cma/"; then
  die "bundled libraries above resolve outside the package (ldd.txt)"
fi

status=0
# WHEEL_CHECK_SUITES picks the suites (default both), e.g. to rerun one;
# WHEEL_CHECK_K, a pytest -k expression, a subset of the torch suite (the
# whole suite takes longer than one device call).
suites="${WHEEL_CHECK_SUITES:-torch numba}"
select=()
[[ -n ${WHEEL_CHECK_K:-} ]] && select=(-k "$WHEEL_CHECK_K")
if [[ $suites == *torch* ]]; then
  PATH="$venv/bin:$PATH" CMA_RESULTS="$out/torch_routes.json" timeout 420 \
    "$vpy" -m pytest -q -p no:cacheprovider --junitxml="$out/torch_junit.xml" "${select[@]}" torch_gpu_test.py \
    > "$out/torch.txt" 2>&1 || status=1
  echo "torch_gpu_test: $(tail -1 "$out/torch.txt")" | tee -a "$out/summary.txt"
  # A skipped suite (no GPU seen) is not a proof.
  if grep -qE "skipped" "$out/torch.txt" && ! grep -qE "[0-9]+ passed" "$out/torch.txt"; then
    status=1
  fi
fi
if [[ $suites == *numba* ]]; then
  PATH="$venv/bin:$PATH" CMA_RESULTS="$out/numba.json" timeout 300 \
    "$vpy" -m pytest -q -p no:cacheprovider --junitxml="$out/numba_junit.xml" numba_gpu_test.py \
    > "$out/numba.txt" 2>&1 || status=1
  echo "numba_gpu_test: $(tail -1 "$out/numba.txt")" | tee -a "$out/summary.txt"
  if ! grep -qE "[0-9]+ passed" "$out/numba.txt"; then status=1; fi
fi
echo "wheel_gpu_check: $([[ $status == 0 ]] && echo PASS || echo FAIL)" | tee -a "$out/summary.txt"
exit "$status"
