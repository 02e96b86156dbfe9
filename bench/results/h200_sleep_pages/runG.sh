#!/bin/bash
# Run G, in the bundle of bench/gpu/package.sh: does a wake right after a
# sleep populate? (`sp delay`), and what NVML sees of a cma allocation.
cd "$(dirname "$0")"
nvcc -O2 -std=c++17 -o sp sleep_phases_experiment.cu -lpthread > $OUT/build.txt 2>&1
timeout 90 ./sp delay > $OUT/sleep_phases_delay.txt 2>&1
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
for r in native cma; do timeout 150 python3 device_memory_used_probe.py $r >> $OUT/device_memory_used.json 2>> $OUT/build.txt; done
