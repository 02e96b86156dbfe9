#!/usr/bin/env bash
# Session 2026-11-29 (second), call 4 (one H200), issue 50: PyTorch's own
# test_cuda.py against this session's pools (not-a-capture MemPool contexts
# growing by arenas) and memory tools. The file of the index's commit
# (000e43cd, 313,414 characters) could not be brought here; this is PyTorch
# 2.6.0's test/test_cuda.py from Debian's source package pytorch
# 2.6.0+dfsg-7 (221,448 bytes, sha256 d243b160...087fb), carried in
# bench/torch_conformance/upstream/v2_6_0/test_cuda.py (ignored by git). Each MemPool, memory
# plot, allocator-settings and graph-statistics test alone in a fresh
# process, then the allocator-facing selection in one process, both routes.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1
d=/tmp/new; mkdir -p $d; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/
export PYTHONPATH=$d CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
F=$R/bench/torch_conformance/upstream/v2_6_0/test_cuda.py
sha256sum $F
cd $R/bench
python3 torch_conformance/run_conformance.py --out $OUT/each --test-file $F --routes native,cma \
  --orders each --jobs 6 --only mempool --only mem_pool --only test_memory_plots \
  --only test_allocator_settings --only graph_memory_stats --only test_memory_snapshot \
  --total-s 220 --route-s 110 2>&1 | tail -25
python3 torch_conformance/run_conformance.py --out $OUT/whole --test-file $F --routes native,cma \
  --orders whole --total-s 320 --route-s 160 2>&1 | tail -25
