#!/usr/bin/env bash
# Session 2026-11-29 (second), call 5 (one H200), issue 50: the default
# DataLoader under the switch now pins its batches. dataloader_route.py (2
# and 8 workers, forkserver, pinned, the choices kept) and the loader bench
# against the pinned pipeline, 2 and 8 workers.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export PYTHONUNBUFFERED=1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > /tmp/build.log 2>&1 )
( cd $d/gpu && timeout 200 python3 dataloader_route.py > $OUT/dataloader_route.json 2> $OUT/dataloader_route.err; echo "route rc=$?" ); tail -c 1500 $OUT/dataloader_route.json
export PYTHONPATH=$d
cd $R/bench
for w in 2 8; do
  timeout 120 python3 torch_managed_cpu_bench.py loader --workers $w --batches 120 \
    --loader-variants pinned,switch --out $OUT/loader_w$w.json > $OUT/loader_w$w.log 2>&1
  echo "workers $w rc=$?"; python3 - $OUT/loader_w$w.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["loader"]
for v in ("pinned", "switch"):
    r = d.get(v, {})
    print(v, {k: r.get(k) for k in ("samples_per_s", "host_bytes", "vm_hwm", "error")})
PY
done
