#!/usr/bin/env bash
# Session 3 of 2026-11-29, call 2 (one H200): cma's oversubscription without
# learning (main as of this call: the documented mode, with its staged step
# and activation offload) under three device headrooms. Call 1 and earlier
# ones ran with device_headroom:512M and showed 3 MB free on the GPU after
# every step (torch.cuda.mem_get_info): the driver evicts managed pages to
# make room for what is not cma's. GPT-2 0.91 B fp32, fused AdamW, batch
# 4x512, 1.5x and 3x, each run beside in memory.
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
for H in 512M 1G 2G; do
  left=$((585 - SECONDS)); echo "headroom $H gets ${left} s"; [ $left -lt 60 ] && break
  ( cd $R/bench && PYTHONPATH=$d timeout $left python3 torch_oversub_bench.py --layers 16 --width 2048 \
     --heads 16 --batch 4 --seq 512 --steps 8 --warmup 4 --ratios 1.5,3 --route-time 25 --setup-timeout 120 \
     --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:$H,managed_budget:{budget_gib}G --fused \
     --routes cma_oversub --json $OUT/headroom_$H.json > $logs/oversub_$H.log 2>&1 )
  grep "cma_oversub |" $logs/oversub_$H.log
done
tar czf $OUT/call2_logs.tar.gz -C $logs .
