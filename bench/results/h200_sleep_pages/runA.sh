#!/bin/bash
# Run A (issue 21 + 20), in the bundle of bench/gpu/package.sh:
# the sleep phases experiment, then PyTorch's test_cuda.py under cma only
# (native's list of the previous run is the baseline: bench/results/h200_torch_allocator/conformance).
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r; } > $OUT/env.txt 2>&1
nvcc -O2 -std=c++17 -o sp sleep_phases_experiment.cu -lpthread >> $OUT/env.txt 2>&1
timeout 100 ./sp > $OUT/sleep_phases.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
timeout 470 python3 torch_conformance/run_conformance.py --out /tmp/conf --routes cma \
  --total-s 455 --route-s 455 --exclude test_out_of_memory_retry \
  --exclude test_set_per_process_memory_fraction \
  --exclude test_caching_allocator_record_stream_oom > $OUT/conformance.log 2>&1
cp /tmp/conf/cma.json /tmp/conf/cma_outcomes.txt $OUT/ 2>/dev/null
echo done >> $OUT/env.txt
