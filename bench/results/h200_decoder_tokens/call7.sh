#!/usr/bin/env bash
# Session 2026-11-27, call 7 (one H200): is the CPU side of the bench's model deterministic?
# cpu_constants_probe.py (no GPU), then native load_probe.py processes one at a time.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so PYTHONUNBUFFERED=1
CUDA_VISIBLE_DEVICES= timeout 100 python3 cpu_constants_probe.py 80 > $OUT/cpu_constants_probe.txt 2>&1
end=$((SECONDS + 90))
while [ $SECONDS -lt $end ]; do timeout 40 python3 load_probe.py native 2>&1 | tail -1; done > $OUT/load_probe_native.jsonl
cat $OUT/cpu_constants_probe.txt; python3 -c "
import json
rows=[json.loads(l) for l in open('$OUT/load_probe_native.jsonl') if l.startswith('{')]
print('native processes', len(rows), 'with wrong tensors', sum(1 for r in rows if r['bad']))
for r in rows:
  if r['bad']: print(json.dumps(r['bad'])[:600])"
