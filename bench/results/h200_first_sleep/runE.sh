#!/bin/bash
# Run E (issue 21), in the bundle of bench/gpu/package.sh: cma's sleep
# benchmark role alone, staging chunks pinned one after another
# (sleep_pin_threads:1) against eight at once (the default), alternating,
# fresh process each.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; nproc; free -g | head -2; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
python3 -c "import cma.torch" 2>/dev/null
for round in 1 2; do
  for threads in 1 8; do
    CMA_ALLOC_CONF=sleep_pin_threads:$threads timeout 120 python3 torch_sleep_levels_bench.py --role cma \
      > /tmp/r.txt 2>&1
    echo "{\"round\": $round, \"sleep_pin_threads\": $threads, \"result\": $(tail -1 /tmp/r.txt)}" >> $OUT/ab.jsonl
  done
done
echo done >> $OUT/env.txt
