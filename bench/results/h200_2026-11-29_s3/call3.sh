#!/usr/bin/env bash
# Session 3 of 2026-11-29, call 3 (one H200): the learned step (learn_step:1)
# after the plan models every allocation at its size except what the caller
# routed to the host for good (oversubscription's optimizer state, which stays
# there: the staged step and the activation offload stay on), so that what the
# host tier took because the device was full lands on the device once the plan
# makes room, and the plan stands from step to step; the optimizer's group
# reported as one use with its state. bench/learn_replay, on the recorded step:
# 1.6 GB each way a step at 1.5x, no host overflow, one plan. GPT-2 0.91 B fp32,
# fused AdamW, batch 4x512, 1.5x and 3x, beside in memory and cma's
# oversubscription without learning (the command of call 1).
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
   --routes cma_oversub,cma_oversub_learn --json $OUT/learn_fused.json \
   > $logs/oversub.log 2>&1 ); tail -24 $logs/oversub.log
tar czf $OUT/call3_logs.tar.gz -C $logs .
