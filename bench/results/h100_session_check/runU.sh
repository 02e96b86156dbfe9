#!/bin/bash
# Run U: the closing check again after the wake fence: the backend contract
# and the CUDA GPU tests, then cma's PyTorch route tests.
cd "$(dirname "$0")"
D=$PWD
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; } > $OUT/env.txt 2>&1
T=$OUT/tests.txt
run() { echo "=== $*" >> $T; timeout 60 "$@" >> $T 2>&1; echo "=== rc=$?" >> $T; }
cd $D/..
run $D/backend_conformance_test
run $D/cuda_gpu_test
grep -E "^=== |PASSED|FAILED|SKIPPED \]" $T > $OUT/tests_summary.txt
cd $D
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
cd py/gpu && CMA_RESULTS=$OUT/torch_routes.json timeout 280 python3 -m pytest -v -p no:cacheprovider torch_gpu_test.py > $OUT/torch_gpu_pytest.txt 2>&1
echo "rc $?" >> $OUT/torch_gpu_pytest.txt
