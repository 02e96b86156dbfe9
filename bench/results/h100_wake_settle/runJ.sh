#!/bin/bash
# Run J (issue 21), in the bundle of bench/gpu/package.sh: the wake settle
# (wake_settle_ms, allocator/discard_settle.h) on cma's sleep benchmark role,
# off (0) against the default (5 ms), alternating, a fresh process each;
# then the whole benchmark (cma beside the vLLM-style way) with the default.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; nproc; free -g | head -2; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
timeout 60 ./backend_conformance_test --gtest_brief=1 > $OUT/backend_conformance.txt 2>&1
echo "rc $?" >> $OUT/backend_conformance.txt
timeout 60 python3 py/gpu/sleep_levels_route.py > $OUT/sleep_levels_route.json 2> $OUT/errors.txt
for round in 1 2; do
  for ms in 0 5; do
    CMA_ALLOC_CONF=wake_settle_ms:$ms timeout 100 python3 torch_sleep_levels_bench.py --role cma \
      > /tmp/r.txt 2>>$OUT/errors.txt
    echo "{\"round\": $round, \"wake_settle_ms\": $ms, \"result\": $(tail -1 /tmp/r.txt)}" >> $OUT/ab.jsonl
  done
done
timeout 150 python3 torch_sleep_levels_bench.py --timeout 70 --json $OUT/torch_sleep_levels.json > /dev/null 2>> $OUT/errors.txt
echo done >> $OUT/env.txt
