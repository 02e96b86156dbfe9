#!/usr/bin/env bash
# Session 2026-11-27, call 6 (one H200): load_probe.py in fresh processes, one at a time,
# cma three times as often as native.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
end=$((SECONDS + ${1:-200}))
while [ $SECONDS -lt $end ]; do
  for r in cma native cma cma; do timeout 60 python3 load_probe.py $r 2>&1 | tail -1; done
done > $OUT/load_probe.jsonl
python3 - <<'PY'
import json, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/load_probe.jsonl") if l.startswith("{")]
for r in ("native", "cma"):
    rs = [x for x in rows if x["route"] == r]
    print(r, "processes", len(rs), "with wrong tensors", sum(1 for x in rs if x["bad"]))
for x in rows:
    if x["bad"]: print(json.dumps(x)[:1500])
PY
