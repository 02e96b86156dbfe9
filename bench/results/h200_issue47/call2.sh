#!/usr/bin/env bash
# Issue 47, call 2 (one H200): the step-in-backward patterns again (cma and
# PyTorch's allocator), the existing GPU routes the fixes touch (pytest
# subset of torch_gpu_test.py), then the hint's speed at 1.5x with its new
# default (gradients kept readable) and with free_grads=True, side by side
# with in-memory and cma without the hint (GPT-2 0.91 B, fused AdamW; the
# command of h200_oversub_inbwd's run 12, routes narrowed).
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
( cd $d/gpu && timeout 200 python3 sib_patterns_route.py cma > $logs/sib_cma.log 2>&1; echo "rc=$?" >> $logs/sib_cma.log )
( cd $d/gpu && timeout 120 python3 sib_patterns_route.py > $logs/sib_native.log 2>&1; echo "rc=$?" >> $logs/sib_native.log )
for f in sib_cma sib_native; do echo "== $f: $(tail -1 $logs/$f.log) $(grep -c '^PASS' $logs/$f.log) PASS"; grep '^FAIL' $logs/$f.log; done
( cd $d/gpu && timeout 300 python3 -m pytest -q torch_gpu_test.py \
   -k "(step_in_backward and fused) or (oversubscription and fused) or managed_cpu or zero_copy or move or record_stream or offload_patterns or dataloader" \
   > $logs/pytest.log 2>&1; echo "rc=$?" >> $logs/pytest.log ); tail -4 $logs/pytest.log
left=$((585 - SECONDS)); echo "oversub gets ${left} s"
( cd $R/bench && PYTHONPATH=$d timeout $left python3 torch_oversub_bench.py --layers 16 --width 2048 \
   --heads 16 --batch 4 --seq 512 --steps 6 --warmup 3 --ratios 1.5 --route-time 30 --setup-timeout 120 \
   --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused \
   --routes cma_oversub,cma_oversub_inbwd,cma_oversub_inbwd_free --json $OUT/train_fused_15.json \
   > $logs/oversub.log 2>&1 ); tail -14 $logs/oversub.log
tar czf $OUT/call2_logs.tar.gz -C $logs .
