#!/usr/bin/env bash
# Session 2026-11-27, call 5 (one H200): is a copy from host memory into managed memory
# ordered after the work queued before it on its stream? (CUDA, then PyTorch per route.)
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
nvcc -O2 -arch=sm_90 -o /tmp/h2d h2d_order_experiment.cu && timeout 120 /tmp/h2d > $OUT/h2d_order.txt 2>&1
for r in native cma; do timeout 100 python3 h2d_order_probe.py $r; done > $OUT/h2d_order_probe.txt 2>&1
cat $OUT/h2d_order.txt $OUT/h2d_order_probe.txt
