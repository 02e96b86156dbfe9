#!/usr/bin/env bash
# Session 5 of 2026-11-29, call 2 (one H200): the kept state measured over the second step (call 1 read the first step's peak, before gradients existed, and kept too much at 1.25x); the learned core alone at 2x
# (CMA_ACTIVATION_OFFLOAD=0) against the learned route with the offload; then the GPU tests the change touches.
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
( cd $R/bench && PYTHONPATH=$d timeout 200 python3 torch_oversub_bench.py --layers 16 --width 2048 \
   --heads 16 --batch 4 --seq 512 --steps 8 --warmup 4 --ratios 1.0,1.25,1.5 --route-time 40 --setup-timeout 120 \
   --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused \
   --routes cma_oversub --json $OUT/fit_2.json > $OUT/oversub.log 2>&1 )
grep "cma_oversub\|inmem" $OUT/oversub.log | tail -4
( cd $R/bench && PYTHONPATH=$d timeout 180 python3 torch_oversub_bench.py --layers 16 --width 2048 \
   --heads 16 --batch 4 --seq 512 --steps 8 --warmup 4 --ratios 2.0 --route-time 60 --setup-timeout 120 \
   --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused \
   --routes cma_oversub_learn_thread,cma_oversub_learn_core --json $OUT/core_2x.json > $OUT/oversub_2x.log 2>&1 )
grep "cma_oversub\|inmem" $OUT/oversub_2x.log | tail -3
left=$((575 - SECONDS)); echo "tests get ${left} s"
( cd $d/gpu && PYTHONPATH=$d CMA_RESULTS=$OUT/tests.json timeout $left python3 -m pytest -q -p no:cacheprovider \
   torch_gpu_test.py -k "keeps_the_state or (staged_step_is_bit_identical and fused)" > $OUT/tests.txt 2>&1 )
tail -5 $OUT/tests.txt
