#!/bin/bash
# Run B (issues 21 and 20), in the bundle of bench/gpu/package.sh: the CUDA
# GPU tests (capture on a stream first seen inside it), the sleep phases
# experiment, the sleep-level route checks and the sleep benchmark.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > $OUT/env.txt 2>&1
timeout 60 ./cuda_gpu_test > $OUT/cuda_gpu_test.txt 2>&1
nvcc -O2 -std=c++17 -o sp sleep_phases_experiment.cu -lpthread >> $OUT/env.txt 2>&1
timeout 150 ./sp > $OUT/sleep_phases.txt 2>&1
timeout 60 python3 py/gpu/sleep_levels_route.py > $OUT/sleep_levels_route.json 2> $OUT/errors.txt
timeout 210 python3 torch_sleep_levels_bench.py --timeout 100 --json $OUT/torch_sleep_levels.json > /dev/null 2>> $OUT/errors.txt
echo done >> $OUT/env.txt
