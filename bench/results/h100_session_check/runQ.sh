#!/bin/bash
# Run Q: the session's closing check on one GPU. The HIP backend through
# hip_on_cuda and the CUDA backend (hip_on_cuda_run.sh's tests: backend
# contract with host functions and timing events on both, cuda_gpu_test on
# both; no cma_bench), then cma's PyTorch route tests.
cd "$(dirname "$0")"
D=$PWD
mkdir -p $OUT/hip
export CMA_HIP_LIBRARY=$D/libamdhip64.so
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
run() { echo "=== $*" >> $T; timeout 60 "$@" >> $T 2>&1; echo "=== rc=$?" >> $T; }
cd $D/..   # the traces are read from bench/traces
run $D/hip_on_cuda_test
run $D/backend_conformance_test
run env CMA_GPU_TEST_BACKEND=hip $D/cuda_gpu_test
run $D/hip_backend_test
run $D/cuda_gpu_test
grep -E "^=== |PASSED|FAILED|SKIPPED \]" $T > $OUT/tests_summary.txt
unset CMA_HIP_LIBRARY
cd $D
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
cd py/gpu && CMA_RESULTS=$OUT/torch_routes.json timeout 280 python3 -m pytest -v -p no:cacheprovider torch_gpu_test.py > $OUT/torch_gpu_pytest.txt 2>&1
echo "rc $?" >> $OUT/torch_gpu_pytest.txt
