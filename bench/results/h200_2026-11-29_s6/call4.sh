#!/usr/bin/env bash
# Session 6 of 2026-11-29, call 4 (two H200s): (1) FSDP2 GPT-2 and Llama over native, expandable and
# cma with this commit's core (AdoptIdleStreams: per-block idleness and marks on busy streams;
# call 2 measured cma's FSDP2 footprint 1.15-1.24x expandable's); (2) ipc_route.py (a CUDA tensor
# under cma put on a torch.multiprocessing queue raises in put()); (3) test_multiprocessing.py's CUDA
# tests on native and cma in what time is left (the file is PyTorch's, carried, not in git).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new PYTHONPATH=$d
w=/tmp/w4; mkdir -p $w/logs
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $w/build.log 2>&1 ); tail -1 $w/build.log
S="--layers 16 --width 1024 --heads 16 --vocab 50304 --batch 4 --seq 512 --warmup 2"
CMA_ALLOC_CONF=managed_budget:64G timeout 230 python3 bench/torch_dist_bench.py $S --steps 12 \
  --routes native,expandable,cma --mode fsdp2 --model gpt2,llama --timeout 45 --json $w/fsdp2.json \
  --log-dir $w/logs > $w/fsdp2.log 2>&1; echo "fsdp2 rc $?"; grep "^| " $w/fsdp2.md
for r in default native; do
  ( cd $d/gpu && timeout 60 python3 ipc_route.py $r > $w/ipc_$r.json 2> $w/ipc_$r.err ); echo "ipc $r rc $?"
  tail -c 1500 $w/ipc_$r.json; echo; tail -2 $w/ipc_$r.err
done
left=$((330 - SECONDS))
if [ $left -gt 40 ]; then
  timeout $left python3 bench/torch_conformance/run_conformance.py --out $w/conf \
    --test-file bench/torch_conformance/upstream/test_multiprocessing.py --routes native,cma \
    --all-tests --only cuda --only event --only rebuild --total-s $((left-15)) --route-s $(((left-15)/2)) \
    --soft-s 40 --hard-s 50 > $w/conf.log 2>&1; tail -4 $w/conf.log; head -c 3000 $w/conf/compare.md
fi
cp $w/*.md $OUT/ 2>/dev/null
tar czf $OUT/call4.tar.gz -C $w --exclude build.log .
