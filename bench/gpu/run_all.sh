#!/usr/bin/env bash
# The GPU suite, run from a folder made by bench/gpu/package.sh:
#   ./run_all.sh OUTDIR
# Tests (CUDA kernels, conformance, two-GPU symmetric mode when two GPUs are
# visible, PyTorch and CuPy routes), then cma_bench (latency, replay,
# migration, symmetric) and the PyTorch move benchmark, results in OUTDIR.
# Safety: managed memory stays far below the device's free memory (blocks of
# 2 GiB, never more than ~10 GiB at once); multicast is never created.
set -u
cd "$(dirname "$0")"
out="${1:?usage: run_all.sh OUTDIR}"
mkdir -p "$out"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  nvidia-smi topo -m | head -4
  python3 -c "import torch,cupy;print('torch',torch.__version__,'cupy',cupy.__version__)"; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
{ ./cuda_symmetric_test; ./cuda_gpu_test; ./backend_conformance_test; } > "$out/gtest.log" 2>&1
grep -E "PASSED|FAILED" "$out/gtest.log"
timeout 420 ./cma_bench --backend=cuda --suite=all --json="$out/cma_bench.json" > "$out/cma_bench.txt" 2>&1
tail -4 "$out/cma_bench.txt"
timeout 120 ./cma_bench --backend=cuda --suite=replay --config=release_before_peak:1 \
  --json="$out/replay_release_before_peak.json"
(cd py/gpu && CMA_RESULTS="$out/torch_routes.json" timeout 600 \
   python3 -m pytest -q -p no:cacheprovider torch_gpu_test.py 2>&1 | tail -4 | tee "$out/pytest.txt")
timeout 300 python3 torch_move_bench.py --json "$out/torch_move.json" > /dev/null
