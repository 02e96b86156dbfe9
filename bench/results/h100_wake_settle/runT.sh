#!/bin/bash
# Run T (issue 21), the wake fence through cma: torch_wake_settle_probe.py 6
# in eight fresh processes, wake_fence:0 and the default (1) alternating;
# the sleep-levels route checks; the whole sleep benchmark (default).
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; nproc; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
python3 -c "import cma.torch" 2>/dev/null
for round in 1 2 3 4; do
  for fence in 0 1; do
    CMA_ALLOC_CONF=managed_budget:16G,wake_fence:$fence timeout 60 python3 torch_wake_settle_probe.py 6 > /tmp/r.txt 2>>$OUT/errors.txt
    echo "{\"round\": $round, \"wake_fence\": $fence, \"result\": $(tail -1 /tmp/r.txt)}" >> $OUT/probe.jsonl
  done
done
timeout 60 python3 py/gpu/sleep_levels_route.py > $OUT/sleep_levels_route.json 2>> $OUT/errors.txt
timeout 150 python3 torch_sleep_levels_bench.py --timeout 70 --json $OUT/torch_sleep_levels.json > /dev/null 2>> $OUT/errors.txt
echo done >> $OUT/env.txt
