#!/usr/bin/env bash
# Session 2026-11-29 (second), call 3 (one H200), issue 50: (1) Llama-like
# serving (torch_compile_decoder_bench.py: compiled with cudagraph trees,
# static KV cache) under each allocator alone and inside a user's MemPool,
# physical peak from NVML, tokens identical across routes; (2) the default
# DataLoader under the CPU switch against the pinned pipeline
# (torch_managed_cpu_bench.py loader: samples/s and host memory), 2 and 8
# workers.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export PYTHONUNBUFFERED=1
d=/tmp/new; mkdir -p $d; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/
export PYTHONPATH=$d CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
cd $R/bench
timeout 330 python3 torch_compile_decoder_bench.py --rounds 1 --budget 320 \
  --routes native,expandable,cma,native+mempool,expandable+mempool,cma+mempool \
  --json $OUT/torch_decoder_mempool.json 2>&1 | tail -16
for w in 2 8; do
  timeout 110 python3 torch_managed_cpu_bench.py loader --workers $w --batches 120 \
    --loader-variants pinned,switch --out $OUT/loader_w$w.json > $OUT/loader_w$w.log 2>&1
  echo "workers $w rc=$?"; python3 - $OUT/loader_w$w.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["loader"]
for v in ("pinned", "switch"):
    r = d.get(v, {})
    print(v, {k: r.get(k) for k in ("samples_per_s", "host_bytes", "vm_hwm", "error")})
PY
done
