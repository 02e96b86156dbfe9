#!/bin/bash
# Run M (issue 21), in the bundle of bench/gpu/package.sh: the wake settle
# measured with timing events. Backend conformance on CUDA (host functions,
# timing events); wakes right after sleeps through cma.torch with the pause
# off (wake_settle_ms:0) and on (the default, 5 ms), alternating, a fresh
# process each (torch_wake_settle_probe.py); then the whole sleep benchmark
# (cma beside the vLLM-style way) with the default.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; nproc; free -g | head -2; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
timeout 60 ./backend_conformance_test --gtest_brief=1 > $OUT/backend_conformance.txt 2>&1
echo "rc $?" >> $OUT/backend_conformance.txt
python3 -c "import cma.torch" 2>/dev/null
for round in 1 2 3; do
  for ms in 0 5; do
    CMA_ALLOC_CONF=managed_budget:16G,wake_settle_ms:$ms timeout 60 python3 torch_wake_settle_probe.py 8 \
      > /tmp/r.txt 2>>$OUT/errors.txt
    echo "{\"round\": $round, \"wake_settle_ms\": $ms, \"result\": $(tail -1 /tmp/r.txt)}" >> $OUT/probe.jsonl
  done
done
timeout 150 python3 torch_sleep_levels_bench.py --timeout 70 --json $OUT/torch_sleep_levels.json > /dev/null 2>> $OUT/errors.txt
echo done >> $OUT/env.txt
