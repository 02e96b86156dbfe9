#!/usr/bin/env bash
# Issue 49's GPU check, not yet run: the device copies the session's own checkout, which the
# helper that wrote this could not change. One command, from the repository root, with the
# main checkout's opt libcma.so and its Abseil/libsodium libraries in .gpu/lib and PyTorch's
# test/test_multiprocessing.py in bench/torch_conformance/upstream/, both carried, neither in git).
# ipc_route.py under cma (default) and PyTorch's allocator (native), then the CUDA tests of
# test_multiprocessing.py (ids containing cuda, event or rebuild) on both routes with the
# conformance harness, in the time left.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=/tmp/ext_ipc CMA_LIBRARY=$PWD/.gpu/lib/libcma.so PYTHONPATH=$PWD/integrations/python
R=$PWD; total=${1:-560}; start=$(date +%s)
cd integrations/python/gpu
for r in default native; do
  s=$(date +%s); timeout 200 python3 ipc_route.py $r > $OUT/ipc_$r.json 2> $OUT/ipc_$r.err
  echo "route $r rc=$? took $(( $(date +%s)-s ))s"; tail -c 2500 $OUT/ipc_$r.json; tail -3 $OUT/ipc_$r.err
done
cd $R; left=$(( total - ($(date +%s)-start) - 20 ))
timeout $left python3 bench/torch_conformance/run_conformance.py --out $OUT/conf \
  --test-file bench/torch_conformance/upstream/test_multiprocessing.py --routes native,cma \
  --all-tests --only cuda --only event --only rebuild --total-s $((left-15)) --route-s $(((left-15)/2)) \
  --soft-s 40 --hard-s 50 2>&1 | tail -8
ls $OUT/conf; head -c 6000 $OUT/conf/compare.md
