#!/bin/bash
# Run D (issue 21), in the bundle of bench/gpu/package.sh: the sleep levels
# benchmark on the final tree, the route checks, and the experiment's
# KV-population-beside-the-copies section.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > $OUT/env.txt 2>&1
timeout 60 python3 py/gpu/sleep_levels_route.py > $OUT/sleep_levels_route.json 2> $OUT/errors.txt
timeout 200 python3 torch_sleep_levels_bench.py --timeout 100 --json $OUT/torch_sleep_levels.json > /dev/null 2>> $OUT/errors.txt
nvcc -O2 -std=c++17 -o sp sleep_phases_experiment.cu -lpthread >> $OUT/env.txt 2>&1
timeout 60 ./sp kv > $OUT/sleep_phases_kv.txt 2>&1
echo done >> $OUT/env.txt
