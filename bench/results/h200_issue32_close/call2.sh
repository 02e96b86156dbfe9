#!/usr/bin/env bash
# Session 2026-11-27b, call 2 (one H200): torch.empty + free per call from Python and
# C++ at this commit (issue 32, goal 2), 7 interleaved rounds pinned to core 5; then the
# BERT training figure of the suite (3 rounds).
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
timeout 300 python3 torch_alloc_pair_bench.py --rounds 7 --core 5 --budget 290 --json $OUT/torch_alloc_pair.json > $OUT/torch_alloc_pair.txt 2>&1
timeout 150 python3 torch_train_bench.py --steps 30 --rounds 3 --budget 140 --json $OUT/torch_train.json > $OUT/torch_train.txt 2>&1
tail -14 $OUT/torch_alloc_pair.txt; tail -8 $OUT/torch_train.txt
