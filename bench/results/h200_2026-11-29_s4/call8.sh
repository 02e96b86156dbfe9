#!/usr/bin/env bash
# Session 4 of 2026-11-29, call 8 (one H200): two more points of the curve, 1.0x (the model fits: what the mode costs) and 2x, cma without learning beside the learned step with its transfer thread.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $OUT/build.log 2>&1 ); tail -1 $OUT/build.log
left=$((275 - SECONDS)); echo "oversub gets ${left} s"
( cd $R/bench && PYTHONPATH=$d timeout $left python3 torch_oversub_bench.py --layers 16 --width 2048 \
   --heads 16 --batch 4 --seq 512 --steps 8 --warmup 4 --ratios 1.0,2 --route-time 40 --setup-timeout 120 \
   --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused \
   --routes cma_oversub,cma_oversub_learn_thread --json $OUT/learn_8.json > $OUT/oversub.log 2>&1 )
grep "cma_oversub" $OUT/oversub.log | tail -5
