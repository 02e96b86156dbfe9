#!/usr/bin/env bash
# Session 5 of 2026-11-29, call 3 (one H200): call 2's 2x learned core without the activation offload
# changed the losses from step 4: again, and without the transfer thread (is it the thread?); the
# kept-state GPU test again (foreach failed in calls 1-2; its output was left out), logs tarred.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
w=/tmp/w3; mkdir -p $w
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $w/build.log 2>&1 ); tail -1 $w/build.log
( cd $d/gpu && PYTHONPATH=$d CMA_RESULTS=$w/tests.json timeout 150 python3 -m pytest -x -q -rA -p no:cacheprovider \
   torch_gpu_test.py -k "keeps_the_state" > $w/tests.txt 2>&1 )
tail -3 $w/tests.txt
( cd $R/bench && PYTHONPATH=$d timeout 280 python3 torch_oversub_bench.py --layers 16 --width 2048 \
   --heads 16 --batch 4 --seq 512 --steps 8 --warmup 4 --ratios 2.0 --route-time 60 --setup-timeout 120 \
   --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused \
   --routes cma_oversub_learn_core,cma_oversub_learn_core_nothread --json $w/core_2x.json > $w/oversub_2x.log 2>&1 )
grep "cma_oversub\|inmem" $w/oversub_2x.log | tail -3
tar czf $OUT/call3.tar.gz -C $w .
