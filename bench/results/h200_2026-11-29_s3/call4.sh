#!/usr/bin/env bash
# Session 3 of 2026-11-29, call 4 (one H200): (1) the away state's transport:
# bench/cuda/away_transport_bench (built here: ./bazelw build -c opt
# //bench/cuda:away_transport_bench, carried in .gpu47/), 1 GiB, median of 3;
# (2) issue 50's DataLoader under the switch against the pinned pipeline,
# with the pinned pipeline's workers also started by forkserver (pinned_fs,
# no cma) to tell the start method's cost from cma's; 2 and 8 workers, two
# rounds interleaved (torch_managed_cpu_bench.py loader).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
timeout 120 $R/.gpu47/away_transport_bench --mib=1024 --reps=3 > $OUT/away_transport.json 2> $OUT/away_transport.err
echo "transport rc=$?"; cat $OUT/away_transport.json; tail -3 $OUT/away_transport.err
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $OUT/build.log 2>&1 ); tail -1 $OUT/build.log
for w in 2 8; do
  left=$((560 - SECONDS)); [ $left -lt 40 ] && break
  ( cd $R/bench && PYTHONPATH=$d timeout $left python3 torch_managed_cpu_bench.py loader --workers $w \
     --batches 120 --loader-rounds 2 --loader-variants pinned,pinned_fs,switch \
     --out $OUT/loader_w$w.json > $OUT/loader_w$w.log 2>&1 )
  echo "workers $w rc=$?"; python3 - $OUT/loader_w$w.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["loader"]
for v in ("pinned", "pinned_fs", "switch"):
    r = d.get(v, {})
    print(v, [round(x.get("samples_per_s", 0)) for x in r.get("rounds", [])],
          [round(x.get("host_bytes", 0) / 1e9, 2) for x in r.get("rounds", [])])
PY
done
