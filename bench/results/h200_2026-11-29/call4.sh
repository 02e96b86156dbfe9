#!/usr/bin/env bash
# Session 2026-11-29, call 4 (one H200): the learned step (learn_step:1,
# issue 48 item 3) against cma's oversubscription without it, GPT-2 0.91 B
# fp32, fused AdamW, batch 4x512, at 1.5x and 3x of the free memory, in one
# run beside in-memory; after call 3: the replay on the clock of reported uses alone,
# own allocations matched by ordinal and size (the command of h200_issue47/call2.sh, routes
# cma_oversub and cma_oversub_learn; the learn route has the same conf plus
# learn_step:1, no code change).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
logs=/tmp/logs; mkdir -p $logs
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $logs/build.log 2>&1 ); tail -2 $logs/build.log
left=$((580 - SECONDS)); echo "oversub gets ${left} s"
( cd $R/bench && PYTHONPATH=$d timeout $left python3 torch_oversub_bench.py --layers 16 --width 2048 \
   --heads 16 --batch 4 --seq 512 --steps 8 --warmup 4 --ratios 1.5,3 --route-time 40 --setup-timeout 120 \
   --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused \
   --routes cma_oversub,cma_oversub_learn --json $OUT/learn_fused_4.json \
   > $logs/oversub.log 2>&1 ); tail -24 $logs/oversub.log
tar czf $OUT/call4_logs.tar.gz -C $logs .
