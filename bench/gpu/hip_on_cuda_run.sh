#!/bin/bash
# hip_on_cuda on an NVIDIA GPU machine: the HIP backend through the forwarding
# libamdhip64.so, with the CUDA backend beside it. Put this script in a folder
# with the -c opt builds of cma_bench, backend_conformance_test, cuda_gpu_test,
# hip_on_cuda_test, hip_backend_test and tests/gpu/hip_on_cuda's
# libamdhip64.so; run it from the repository root (the traces are read from
# bench/traces) with OUT naming the results folder.
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:?set OUT to the results folder}
export CMA_HIP_LIBRARY=$D/libamdhip64.so
T=$OUT/tests.txt
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "CMA_HIP_LIBRARY=$CMA_HIP_LIBRARY"
} > $OUT/env.txt 2>&1
run() { echo "=== $*" >> $T; timeout 30 "$@" >> $T 2>&1; echo "=== rc=$?" >> $T; }
run $D/hip_on_cuda_test
run $D/backend_conformance_test
run env CMA_GPU_TEST_BACKEND=hip $D/cuda_gpu_test
grep -E "^=== |PASSED|FAILED|SKIPPED \]" $T > $OUT/tests_summary.txt
B=$OUT/bench.txt
echo "=== cma_bench --backend=hip --json=cma_bench_hip_on_cuda.json" > $B
timeout 70 $D/cma_bench --backend=hip --json=$OUT/cma_bench_hip_on_cuda.json >> $B 2>&1
echo "=== rc=$?" >> $B
echo "=== cma_bench --backend=cuda --json=cma_bench_cuda.json" >> $B
timeout 70 $D/cma_bench --backend=cuda --json=$OUT/cma_bench_cuda.json >> $B 2>&1
echo "=== rc=$?" >> $B
run $D/hip_backend_test
run $D/cuda_gpu_test
grep -E "^=== |PASSED|FAILED|SKIPPED \]" $T > $OUT/tests_summary.txt
