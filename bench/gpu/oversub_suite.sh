#!/usr/bin/env bash
# Issue 30's runs on the GPU machine, from a folder made by bench/gpu/package.sh:
#   ./oversub_suite.sh OUTDIR smoke|train|infer
# smoke: the GPU unit tests (no regression from the mode's code), then the
#        benchmark's --quick train and infer (plumbing, one small model);
# train: torch_oversub_bench.py at 1.5x and 3x oversubscription, every route
#        (EXTRA=--fused: AdamW(fused=True) in every route);
# infer: weights 2x the free memory, greedy generation, every route.
# Each part fits one 10-minute command. Oversubscription only here, bounded
# as issue 30 says (the bench refuses a route whose host need passes half of
# MemAvailable, and its blocker dies with it); no multicast.
set -u
cd "$(dirname "$0")"
out="${1:?usage: oversub_suite.sh OUTDIR smoke|train|infer}"
part="${2:?smoke|train|infer}"
mkdir -p "$out"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  grep -E "MemTotal|MemAvailable" /proc/meminfo; nproc
  python3 -c "import torch,transformers,accelerate;print('torch',torch.__version__,'transformers',transformers.__version__,'accelerate',accelerate.__version__)"; } > "$out/env_$part.txt" 2>&1
cat "$out/env_$part.txt"
case $part in
  smoke)
    { ./cuda_gpu_test; ./backend_conformance_test; } > "$out/gtest.log" 2>&1
    grep -E "^\[  (PASSED|FAILED) " "$out/gtest.log"
    # (a small model: cma's headroom for what is not its own shrinks with it)
    small=oversubscribe:1,device_headroom:128M,managed_budget:{budget_gib}G
    timeout 240 python3 torch_oversub_bench.py --quick --cma-conf $small \
      --json "$out/oversub_quick.json" 2>&1 | tail -25
    timeout 200 python3 torch_oversub_bench.py --quick --mode infer --cma-conf $small \
      --json "$out/oversub_quick_infer.json" 2>&1 | tail -20 ;;
  train)
    timeout 580 python3 torch_oversub_bench.py --layers ${LAYERS:-16} --width ${WIDTH:-2048} \
      --heads 16 --batch ${BATCH:-4} --seq 512 --steps 5 --warmup 2 --ratios ${RATIOS:-1.5,3} \
      --route-time ${ROUTE_TIME:-40} --setup-timeout 120 --plain-steps 3 \
      --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G ${EXTRA:-} \
      --json "$out/oversub_train.json" 2>&1 | tail -40 ;;
  infer)
    timeout 580 python3 torch_oversub_bench.py --mode infer --layers ${LAYERS:-24} \
      --width ${WIDTH:-3072} --heads 24 --batch 4 --prompt-len 128 --new-tokens 32 --steps 3 \
      --warmup 1 --ratios 2 --route-time ${ROUTE_TIME:-60} --setup-timeout 120 \
      --json "$out/oversub_infer.json" 2>&1 | tail -30 ;;
esac
