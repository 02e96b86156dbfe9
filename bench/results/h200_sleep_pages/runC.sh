#!/bin/bash
# Run C (issue 20), in the bundle of bench/gpu/package.sh: PyTorch's
# test_cuda.py under cma (capture fix, MemPool(allocator)), then cma's
# PyTorch route tests (foreign-allocator pools among them).
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
timeout 400 python3 torch_conformance/run_conformance.py --out /tmp/conf --routes cma \
  --total-s 380 --route-s 380 --exclude test_out_of_memory_retry \
  --exclude test_set_per_process_memory_fraction \
  --exclude test_caching_allocator_record_stream_oom > $OUT/conformance.log 2>&1
cp /tmp/conf/cma.json $OUT/ 2>/dev/null
(cd py/gpu && CMA_RESULTS=$OUT/torch_routes.json timeout 170 \
   python3 -m pytest -q -p no:cacheprovider torch_gpu_test.py > $OUT/torch_gpu_pytest.txt 2>&1)
echo done >> $OUT/env.txt
