#!/usr/bin/env bash
# Issue 49 items 1 and 3 on two H200s: bench/torch_dist_bench.py, routes native, expandable, cma x
# ddp, fsdp2 x gpt2, llama (~0.3 B parameters each, 6 timed steps after 2 warm-up), then the
# collectives' bus bandwidth (1 MiB .. 1 GiB). ITEM3=1 adds cma_oversub and fsdp2_cpu_offload
# (fsdp2, gpt2, at --ratio 1.5) if time is left. Whole call under ~7 minutes.
# Run from the repository root (OUT set); the cma package is copied as in
# h200_2026-11-29_s5/call4.sh, its library from ${CMA_LIB_DIR:-.gpu47/lib}.
set -u
cd "$(dirname "$0")/../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
# the cma route's conf (torch_routes' default 16G is near DDP's ~14 GB per rank here)
export CMA_ALLOC_CONF=${CMA_ALLOC_CONF:-managed_budget:64G}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch;print('torch',torch.__version__,'nccl',torch.cuda.nccl.version())"
  nvidia-smi topo -m; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/${CMA_LIB_DIR:-.gpu47/lib}/* $d/cma/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new PYTHONPATH=$d
w=/tmp/wdist; mkdir -p $w/logs
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $w/build.log 2>&1 ); tail -1 $w/build.log
S="--layers 16 --width 1024 --heads 16 --vocab 50304 --batch 4 --seq 512 --steps 6 --warmup 2 --timeout 90"
# 12 jobs of ~20-25 s each (torchrun, torch's import, NCCL's set-up, 8 steps)
timeout 320 python3 bench/torch_dist_bench.py $S --routes native,expandable,cma --mode ddp,fsdp2 \
  --model gpt2,llama --json $w/train.json --log-dir $w/logs > $w/train.log 2>&1
echo "train rc $?"; grep "^| " $w/train.md
timeout 100 python3 bench/torch_dist_bench.py --collectives --routes native,expandable,cma \
  --coll-min-mib 1 --coll-max-mib 1024 --coll-factor 4 --timeout 60 \
  --json $w/coll.json --log-dir $w/logs > $w/coll.log 2>&1
echo "coll rc $?"; grep "^| " $w/coll.md
left=$((400 - SECONDS))
if [ "${ITEM3:-0}" = 1 ] && [ $left -gt 60 ]; then
  # the in-memory peak: native fsdp2 gpt2's above (max over ranks), so native need not run again
  peak=$(python3 -c "import json; r=[x for x in json.load(open('$w/train.json'))['rows'] if
    (x['route'], x['mode'], x['model']) == ('native', 'fsdp2', 'gpt2') and x['peak_MiB']]
print(r[0]['peak_MiB'] / 1024 if r else 0)")
  timeout $left python3 bench/torch_dist_bench.py $S --routes cma_oversub,fsdp2_cpu_offload \
    --mode fsdp2 --model gpt2 --ratio 1.5 --peak-gib $peak --timeout 60 --json $w/item3.json --log-dir $w/logs \
    > $w/item3.log 2>&1
  echo "item3 rc $?"; grep "^| " $w/item3.md
fi
cp $w/*.md $OUT/ 2>/dev/null
tar czf $OUT/dist.tar.gz -C $w .
