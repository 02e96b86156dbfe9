#!/bin/bash
# Run F (issue 20): PyTorch's test_cuda.py under cma with the NVML log (what
# test_device_memory_used sees inside the suite).
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
export CMA_CONF_NVML_LOG=$OUT/nvml_log.jsonl
timeout 230 python3 torch_conformance/run_conformance.py --out /tmp/conf --routes cma \
  --total-s 215 --route-s 215 --exclude test_out_of_memory_retry \
  --exclude test_set_per_process_memory_fraction \
  --exclude test_caching_allocator_record_stream_oom > $OUT/conformance.log 2>&1
