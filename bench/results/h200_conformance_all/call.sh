#!/usr/bin/env bash
# Session 2026-11-27b (one H200): EVERY test of test_cuda.py (--all-tests, not only
# the allocator-facing keywords), the whole file in one process as PyTorch's CI runs
# it, ONE route per call (ROUTE=cma|native). cma.torch's extension is compiled first.
set -u
cd "$(dirname "$0")"
route=${ROUTE:-cma}
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/wall_$route; mkdir -p $w
if [[ $route == cma ]]; then
  python3 -c "import torch, cma.torch as c; c.use_as_default(); print(torch.empty(1, device='cuda').data_ptr() != 0)" > $w/warm.log 2>&1
fi
timeout ${LIMIT_S:-580} python3 torch_conformance/run_conformance.py --out $w/whole --routes $route --orders whole --all-tests \
  --total-s ${BUDGET_S:-565} --route-s ${BUDGET_S:-565} > $w/whole.log 2>&1
cp $w/whole/*.json $OUT/ 2>/dev/null
tar czf $OUT/all_$route.tar.gz -C $w .
tail -6 $w/whole.log
