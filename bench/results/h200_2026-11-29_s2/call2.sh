#!/usr/bin/env bash
# Session 2026-11-29 (second), call 2 (one H200): MemPool footprint (issue 50).
# torch_train_bench.py's BERT varlen training loop (batch and sequence length
# drawn per step) under each allocator, alone and inside
# torch.cuda.use_mem_pool(torch.cuda.MemPool()), one fresh process per route,
# physical peak from NVML; losses must be identical across routes.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export PYTHONUNBUFFERED=1
d=/tmp/new; mkdir -p $d; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/
export PYTHONPATH=$d CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
cd $R/bench
timeout 560 python3 torch_train_bench.py --rounds 1 --steps 30 \
  --routes native,expandable,cma,native+mempool,expandable+mempool,cma+mempool \
  --json $OUT/torch_train_mempool.json 2>&1 | tail -30
cp $OUT/torch_train_mempool.txt /dev/stdout 2>/dev/null || true
