#!/bin/bash
# Run H (issue 21), in the bundle of bench/gpu/package.sh, built from a tree not kept
# (Wake populating disposable blocks on a side stream): the sleep levels
# benchmark with Wake populating disposable blocks on a side stream.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > $OUT/env.txt 2>&1
timeout 60 python3 py/gpu/sleep_levels_route.py > $OUT/sleep_levels_route.json 2> $OUT/errors.txt
timeout 200 python3 torch_sleep_levels_bench.py --timeout 100 --json $OUT/torch_sleep_levels.json > /dev/null 2>> $OUT/errors.txt
