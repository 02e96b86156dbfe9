#!/usr/bin/env bash
# Session 2026-11-27, call 3 (one H200): test_cuda.py in chunks of 20 on cma (native's
# baseline: run 8), and the route tests call 2's 300 s limit cut (the oversubscription ones).
set -u
cd "$(dirname "$0")"
mkdir -p torch_conformance/upstream && cp ../bench/torch_conformance/upstream/test_cuda.py torch_conformance/upstream/
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/wc3; mkdir -p $w
timeout 315 python3 torch_conformance/run_conformance.py --out $w/chunks --routes cma --orders chunks --total-s 305 --route-s 305 > $w/chunks.log 2>&1
(cd py/gpu && CMA_RESULTS=$w/torch_routes_oversub.json timeout 265 python3 -m pytest -v -p no:cacheprovider torch_gpu_test.py -k "oversubscription_staged or step_in_backward" --durations=0 2>&1 | tail -30) > $w/route_tests_oversub.txt
cp $w/route_tests_oversub.txt $OUT/; cp $w/chunks/*.json $OUT/ 2>/dev/null
tar czf $OUT/call3.tar.gz -C $w .
tail -4 $w/chunks.log; tail -14 $w/route_tests_oversub.txt
