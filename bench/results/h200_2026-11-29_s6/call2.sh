#!/usr/bin/env bash
# Session 6 of 2026-11-29, call 2 (two H200s): after call 1 of dist_call.sh (this folder's dist/):
# (1) the FSDP2 GPU test (fsdp_route.py: DTensor parameters and state under oversubscribe:1, the
# activation offload's watch fixed); (2) issue 49 item 3 again (cma_oversub and fsdp2_cpu_offload,
# FSDP2 GPT-2 at 1.5x per rank, peak 8.4375 GiB from dist/'s native fsdp2 gpt2); (3) native's
# allocation traces of DDP and FSDP2 GPT-2 per rank (to replay cma's FSDP2 footprint on the host
# backend); (4) fsdp2 x gpt2,llama over native, expandable, cma again with 12 timed steps.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new PYTHONPATH=$d
w=/tmp/w2; mkdir -p $w/logs $w/traces
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $w/build.log 2>&1 ); tail -1 $w/build.log
( cd $d/gpu && CMA_RESULTS=$w/tests.json timeout 150 python3 -m pytest -q -rf -p no:cacheprovider \
   torch_gpu_test.py -k "fsdp2" > $w/tests.txt 2>&1 ); tail -3 $w/tests.txt
S="--layers 16 --width 1024 --heads 16 --vocab 50304 --batch 4 --seq 512 --warmup 2"
timeout 130 python3 bench/torch_dist_bench.py $S --steps 6 --routes cma_oversub,fsdp2_cpu_offload \
  --mode fsdp2 --model gpt2 --ratio 1.5 --peak-gib 8.4375 --timeout 60 --json $w/item3.json \
  --log-dir $w/logs > $w/item3.log 2>&1; echo "item3 rc $?"; grep "^| " $w/item3.md
timeout 80 python3 bench/torch_dist_bench.py $S --steps 4 --routes native --mode ddp,fsdp2 --model gpt2 \
  --timeout 35 --record-trace $w/traces --json $w/trace.json --log-dir $w/logs > $w/trace.log 2>&1
echo "trace rc $?"; ls -la $w/traces
CMA_ALLOC_CONF=managed_budget:64G timeout $((520 - SECONDS)) python3 bench/torch_dist_bench.py $S --steps 12 \
  --routes native,expandable,cma --mode fsdp2 --model gpt2,llama --timeout 45 --json $w/fsdp2.json \
  --log-dir $w/logs > $w/fsdp2.log 2>&1; echo "fsdp2 rc $?"; grep "^| " $w/fsdp2.md
cp $w/*.md $OUT/ 2>/dev/null
tar czf $OUT/call2.tar.gz -C $w --exclude build.log .
