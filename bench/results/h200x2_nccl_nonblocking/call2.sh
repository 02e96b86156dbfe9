#!/usr/bin/env bash
# Session 2026-11-27, second nvidia-h200-x2 call: on a non-blocking communicator, does NCCL
# 2.28.9 register a symmetric window for torch's own SymmetricMemory backend? (NCCL's INFO log kept.)
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
TORCH_NCCL_USE_COMM_NONBLOCKING=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG,ALLOC timeout 120 torchrun --nproc-per-node 2 nonblocking_probe.py > $OUT/nonblocking_probe.log 2>&1
timeout 120 torchrun --nproc-per-node 2 nonblocking_probe.py > $OUT/blocking_probe.log 2>&1
grep -h PROBE $OUT/nonblocking_probe.log $OUT/blocking_probe.log; grep -i "symmetric\|window\|nonblock\|blocking" $OUT/nonblocking_probe.log | head -20
