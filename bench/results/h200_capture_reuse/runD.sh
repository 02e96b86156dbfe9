#!/bin/bash
# Run D (issues 20 and 21), in the bundle of bench/gpu/package.sh: the sleep
# benchmark (first cycle with chunks pinned on several threads), PyTorch's
# test_cuda.py under cma (EmptyCache waits for its discards), cma's PyTorch
# route tests.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
timeout 200 python3 torch_sleep_levels_bench.py --timeout 100 --json $OUT/torch_sleep_levels.json > $OUT/sleep.log 2>&1
timeout 230 python3 torch_conformance/run_conformance.py --out /tmp/conf --routes cma \
  --total-s 215 --route-s 215 --exclude test_out_of_memory_retry \
  --exclude test_set_per_process_memory_fraction \
  --exclude test_caching_allocator_record_stream_oom > $OUT/conformance.log 2>&1
cp /tmp/conf/cma.json $OUT/ 2>/dev/null
(cd py/gpu && CMA_RESULTS=$OUT/torch_routes.json timeout 220 \
   python3 -m pytest -v -p no:cacheprovider torch_gpu_test.py > $OUT/torch_gpu_pytest.txt 2>&1)
echo done >> $OUT/env.txt
