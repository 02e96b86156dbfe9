#!/bin/bash
# Run A (issue 20), in the bundle of bench/gpu/package.sh: the CUDA GPU tests
# (a real capture reusing a block after its streams joined), the failed-capture
# probe under native and cma, then PyTorch's test_cuda.py under cma.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
timeout 120 ./cuda_gpu_test > $OUT/cuda_gpu_test.txt 2>&1
for r in native cma; do timeout 60 python3 failed_capture_probe.py $r; done > $OUT/failed_capture_probe.txt 2>&1
timeout 400 python3 torch_conformance/run_conformance.py --out /tmp/conf --routes cma \
  --total-s 380 --route-s 380 --exclude test_out_of_memory_retry \
  --exclude test_set_per_process_memory_fraction \
  --exclude test_caching_allocator_record_stream_oom > $OUT/conformance.log 2>&1
cp /tmp/conf/cma.json $OUT/ 2>/dev/null
echo done >> $OUT/env.txt
