#!/usr/bin/env bash
# The GPU suite, run from a folder made by bench/gpu/package.sh:
#   ./run_all.sh OUTDIR [core|torch|all|conformance]      (default all)
# core:  tests (CUDA kernels, conformance, two-GPU symmetric mode when two GPUs
#        are visible), then cma_bench (latency, replay, migration, symmetric),
#        and the replay with classic segments for comparison.
# torch: the PyTorch/CuPy route tests, the Numba EMM plugin test, the side-by-side PyTorch replay
#        (native, expandable segments, cma), the training-loop benchmark, and
#        the move benchmark.
# conformance: PyTorch's test_cuda.py allocator tests under native and cma
#        (torch_conformance/README.md); not part of "all": it takes ~8 minutes.
# Each part fits one 10-minute command. Results go to OUTDIR.
# Safety: managed memory stays far below the device's free memory (blocks of
# 2 GiB, never more than ~16 GiB at once); multicast is never created.
set -u
cd "$(dirname "$0")"
out="${1:?usage: run_all.sh OUTDIR [core|torch|all]}"
part="${2:-all}"
mkdir -p "$out"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  nvidia-smi topo -m | head -4
  python3 -c "import torch,cupy;print('torch',torch.__version__,'cupy',cupy.__version__)"; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
if [[ $part == core || $part == all ]]; then
  { ./cuda_symmetric_test; ./cuda_gpu_test; ./backend_conformance_test; } > "$out/gtest.log" 2>&1
  grep -E "PASSED|FAILED" "$out/gtest.log"
  timeout 420 ./cma_bench --backend=cuda --suite=all --json="$out/cma_bench.json" > "$out/cma_bench.txt" 2>&1
  # Latency again on one pinned core: the shared host's scheduling moves the
  # unpinned figures by up to 2x between runs.
  timeout 150 taskset -c 5 ./cma_bench --backend=cuda --suite=latency --reps=51 \
    --json="$out/latency_pinned.json" > "$out/latency_pinned.txt" 2>&1
  tail -16 "$out/cma_bench.txt"
  timeout 120 ./cma_bench --backend=cuda --suite=replay --config=segments:classic \
    --json="$out/replay_classic.json" | tail -3
  if [[ $(nvidia-smi -L | wc -l) -ge 2 ]]; then  # symmetric memory from Python, two processes
    timeout 240 torchrun --nproc-per-node 2 py/gpu/symmetric_gpu.py torch "$out/symmetric_torch.json" \
      2>&1 | tail -2
    timeout 120 mpirun --allow-run-as-root -np 2 -x PYTHONPATH -x CMA_LIBRARY -x CMA_DISABLE_MULTICAST \
      python3 py/gpu/symmetric_gpu.py mpi "$out/symmetric_mpi.json" 2>&1 | tail -2
  fi
fi
if [[ $part == conformance ]]; then
  timeout 590 python3 torch_conformance/run_conformance.py --out "$out/conformance" \
    --routes "${CONFORMANCE_ROUTES:-native,cma}" 2>&1 | tail -60
fi
if [[ $part == torch || $part == all ]]; then
  (cd py/gpu && CMA_RESULTS="$out/torch_routes.json" timeout 300 \
     python3 -m pytest -q -p no:cacheprovider torch_gpu_test.py 2>&1 | tail -6 | tee "$out/pytest.txt")
  (cd py/gpu && CMA_RESULTS="$out/numba_gpu.json" timeout 200 \
     python3 -m pytest -q -p no:cacheprovider numba_gpu_test.py 2>&1 | tail -6 | tee "$out/pytest_numba.txt")
  timeout 200 python3 torch_replay.py --json "$out/torch_replay.json" 2>&1 | tee "$out/torch_replay.txt"
  timeout 480 python3 torch_train_bench.py --steps 40 --rounds 3 --budget 460 --json "$out/torch_train.json" 2>&1 \
    | tee "$out/torch_train.log"  # the script writes torch_train.txt (its table) itself
  timeout 200 python3 torch_sleep_bench.py --json "$out/torch_sleep.json" 2>&1 | tail -30
fi
