#!/usr/bin/env bash
# Session 2026-11-27 (nvidia-h200-x2): cma's NCCL windows on non-blocking
# communicators (the wait for ncclInProgress, never run on a GPU before), and
# the give-up when CMA_NCCL_TIMEOUT_S is shorter than a registration takes.
# Then the two-GPU route test and the symmetric C++ tests as regressions.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
w=/tmp/w2; mkdir -p $w
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch;print(torch.__version__, torch.cuda.nccl.version())"; } > $w/env.txt 2>&1
# 1. Non-blocking communicators, the bench's checks and small sizes.
TORCH_NCCL_USE_COMM_NONBLOCKING=1 CMA_BENCH_ROUNDS=7 CMA_BENCH_MAX_BYTES=1048576 timeout 170 \
  torchrun --nproc-per-node 2 torch_nccl_window_bench.py $w/nonblocking.json > $w/nonblocking.log 2>&1
echo "nonblocking rc=$?" >> $w/env.txt
# 2. A limit no registration meets: kDeadlineExceeded expected on every rank.
TORCH_NCCL_USE_COMM_NONBLOCKING=1 CMA_NCCL_TIMEOUT_S=0.000001 CMA_BENCH_ROUNDS=1 CMA_BENCH_MAX_BYTES=65536 timeout 90 \
  torchrun --nproc-per-node 2 torch_nccl_window_bench.py $w/giveup.json > $w/giveup.log 2>&1
echo "giveup rc=$?" >> $w/env.txt
# 3. Regressions on two GPUs.
(cd py/gpu && CMA_RESULTS=$w/two_gpus.json timeout 150 python3 -m pytest -q -p no:cacheprovider torch_gpu_test.py -k two_gpus 2>&1 | tail -5) > $w/two_gpus.txt
timeout 120 ./cuda_symmetric_test > $w/cuda_symmetric_test.log 2>&1; echo "cuda_symmetric_test rc=$?" >> $w/env.txt
cp $w/env.txt $w/nonblocking.json $w/nonblocking.log $w/giveup.log $w/two_gpus.txt $OUT/ 2>/dev/null
tar czf $OUT/call.tar.gz -C $w .
cat $w/env.txt; grep -h -i "check\|deadline\|CMA_NCCL\|error" $w/nonblocking.log $w/giveup.log | head -20; cat $w/two_gpus.txt; tail -3 $w/cuda_symmetric_test.log
