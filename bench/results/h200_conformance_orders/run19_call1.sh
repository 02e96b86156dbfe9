#!/usr/bin/env bash
# Session 2026-11-27b, run 19 (one H200): test_cuda.py with each test in a fresh
# process, on ONE route per call (ROUTE=cma|native, default cma), six processes at
# once (--jobs 6); every test that fails, errors, times out or crashes then runs
# again alone (parallel.py). cma.torch's extension is compiled once first, so the
# six first children do not wait on one compile.
set -u
cd "$(dirname "$0")"
route=${ROUTE:-cma}
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/w19_$route; mkdir -p $w
if [[ $route == cma ]]; then
  ( time python3 -c "import torch, cma.torch as c; c.use_as_default(); print(torch.empty(1, device='cuda').data_ptr() != 0)" ) > $w/warm.log 2>&1
fi
timeout ${LIMIT_S:-575} python3 torch_conformance/run_conformance.py --out $w/each --routes $route --orders each --jobs ${JOBS:-6} \
  --total-s ${BUDGET_S:-560} --route-s ${BUDGET_S:-560} > $w/each.log 2>&1
cp $w/each/*.json $OUT/ 2>/dev/null
tar czf $OUT/run19_$route.tar.gz -C $w .
tail -3 $w/warm.log 2>/dev/null; tail -6 $w/each.log
