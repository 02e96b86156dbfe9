#!/bin/bash
# Run C (issue 20): PyTorch's test_cuda.py under cma with the context log
# (which test leaves a pool context of cma's open).
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > $OUT/env.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
export CMA_CONF_CONTEXT_LOG=$OUT/open_contexts.txt
timeout 300 python3 torch_conformance/run_conformance.py --out /tmp/conf --routes cma \
  --total-s 280 --route-s 280 --exclude test_out_of_memory_retry \
  --exclude test_set_per_process_memory_fraction \
  --exclude test_caching_allocator_record_stream_oom > $OUT/conformance.log 2>&1
cp /tmp/conf/cma.json $OUT/ 2>/dev/null
echo done >> $OUT/env.txt
