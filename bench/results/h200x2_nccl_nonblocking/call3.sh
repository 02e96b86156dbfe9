#!/usr/bin/env bash
# Session 2026-11-27, third nvidia-h200-x2 call: after the fix (every NCCL call waits for a
# non-blocking communicator's previous operation first), the window bench's checks on
# non-blocking communicators, the give-up, and the probe.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
w=/tmp/w3; mkdir -p $w
TORCH_NCCL_USE_COMM_NONBLOCKING=1 CMA_BENCH_ROUNDS=5 CMA_BENCH_MAX_BYTES=1048576 timeout 150 \
  torchrun --nproc-per-node 2 torch_nccl_window_bench.py $w/nonblocking_fixed.json > $w/nonblocking_fixed.log 2>&1
echo "nonblocking rc=$?" > $w/rc.txt
TORCH_NCCL_USE_COMM_NONBLOCKING=1 CMA_NCCL_TIMEOUT_S=0.000001 CMA_BENCH_ROUNDS=1 CMA_BENCH_MAX_BYTES=65536 timeout 60 \
  torchrun --nproc-per-node 2 torch_nccl_window_bench.py $w/giveup.json > $w/giveup_fixed.log 2>&1
echo "giveup rc=$?" >> $w/rc.txt
TORCH_NCCL_USE_COMM_NONBLOCKING=1 timeout 60 torchrun --nproc-per-node 2 nonblocking_probe.py > $w/nonblocking_probe_fixed.log 2>&1
cp $w/rc.txt $w/nonblocking_fixed.json $w/nonblocking_fixed.log $w/giveup_fixed.log $w/nonblocking_probe_fixed.log $OUT/ 2>/dev/null
cat $w/rc.txt; grep -h "checks\|PROBE" $w/nonblocking_fixed.log $w/nonblocking_probe_fixed.log | head; grep -h "Error" $w/giveup_fixed.log | grep -v Traceback | head -4
