#!/usr/bin/env bash
# Session 2026-11-27b, call 2 (one H200), after the snapshot's merged free
# neighbours and the uncached mode: cma's route tests for them, then EVERY test of
# test_cuda.py on cma, whole file in one process (native's run: call.sh, unchanged).
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/wall2; mkdir -p $w
( time python3 -c "import torch, cma.torch as c; c.use_as_default(); print(torch.empty(1, device='cuda').data_ptr() != 0)" ) > $w/warm.log 2>&1
(cd py/gpu && CMA_RESULTS=$w/route.json timeout 200 python3 -m pytest -q -p no:cacheprovider torch_gpu_test.py \
  -k "uncached or statistics_are_cmas or memory_tools or mempool_with_another or allocator_interface" 2>&1 | tail -25) > $w/route_tests.txt
timeout 340 python3 torch_conformance/run_conformance.py --out $w/whole --routes cma --orders whole --all-tests \
  --total-s 330 --route-s 330 > $w/whole.log 2>&1
cp $w/route_tests.txt $OUT/; cp $w/whole/*.json $OUT/ 2>/dev/null
tar czf $OUT/call2.tar.gz -C $w .
tail -3 $w/warm.log; tail -8 $w/route_tests.txt; tail -4 $w/whole.log
