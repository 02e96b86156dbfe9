#!/usr/bin/env bash
# Session 5 of 2026-11-29, call 4 (one H200): why the 2x learned core without the activation offload
# changes losses (call 3: two runs, two different wrong values from step 4: a race, not the transfer
# thread). (1) the host tier alone at 2x (cma_oversub_direct: no learning, no offload) beside the learned
# core; (2) the learned core again with discards turned into no-ops (a build of this commit with
# CMA_DEBUG_NO_DISCARD honoured in backends/cuda/cuda_managed.cc, not committed: .gpu47/lib_nodiscard);
# then the kept-state GPU test (call 3's foreach failure was the test reading a CPU step counter).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
mkdir -p $d/nodiscard && cp $R/.gpu47/lib_nodiscard/libcma.so $d/nodiscard/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
w=/tmp/w4; mkdir -p $w
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $w/build.log 2>&1 ); tail -1 $w/build.log
B="--layers 16 --width 2048 --heads 16 --batch 4 --seq 512 --steps 5 --warmup 2 --ratios 2.0 --route-time 45 --setup-timeout 120 --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused"
( cd $R/bench && PYTHONPATH=$d timeout 200 python3 torch_oversub_bench.py $B \
   --routes cma_oversub_direct,cma_oversub_learn_core --json $w/direct_2x.json > $w/direct_2x.log 2>&1 )
grep "cma_oversub\|inmem" $w/direct_2x.log | tail -2
( cd $R/bench && CMA_DEBUG_NO_DISCARD=1 CMA_LIBRARY=$d/nodiscard/libcma.so PYTHONPATH=$d timeout 150 python3 torch_oversub_bench.py $B \
   --routes cma_oversub_learn_core --json $w/nodiscard_2x.json > $w/nodiscard_2x.log 2>&1 )
grep "cma_oversub\|inmem" $w/nodiscard_2x.log | tail -1
left=$((560 - SECONDS)); echo "tests get ${left} s"
( cd $d/gpu && PYTHONPATH=$d CMA_RESULTS=$w/tests.json timeout $left python3 -m pytest -q -rf -p no:cacheprovider \
   torch_gpu_test.py -k "keeps_the_state and foreach" > $w/tests.txt 2>&1 )
tail -2 $w/tests.txt
tar czf $OUT/call4.tar.gz -C $w .
