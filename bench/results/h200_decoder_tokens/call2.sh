#!/usr/bin/env bash
# Session 2026-11-27, call 2 (one H200): PyTorch's test_cuda.py selection as a whole file
# on cma after the drain change (native's baseline: run 7), and cma's route tests in full.
set -u
cd "$(dirname "$0")"
mkdir -p torch_conformance/upstream && cp ../bench/torch_conformance/upstream/test_cuda.py torch_conformance/upstream/
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/wc2; mkdir -p $w
timeout 275 python3 torch_conformance/run_conformance.py --out $w/whole --routes cma --orders whole --total-s 265 --route-s 265 > $w/whole.log 2>&1
(cd py/gpu && CMA_RESULTS=$w/torch_routes.json timeout 300 python3 -m pytest -q -p no:cacheprovider torch_gpu_test.py 2>&1 | tail -30) > $w/route_tests.txt
cp $w/route_tests.txt $OUT/; cp $w/whole/*.json $OUT/ 2>/dev/null
tar czf $OUT/call2.tar.gz -C $w .
tail -5 $w/whole.log; tail -8 $w/route_tests.txt
