#!/usr/bin/env bash
# Session 2026-11-26 (8th), call 1: GPU check of the drain change and the harness fix.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py:$PWD/probe CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
w=/tmp/w; mkdir -p $w
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; git -C .. log -1 --format=%h 2>/dev/null; } > $w/env.txt 2>&1
(cd py/gpu && timeout 150 python3 foreign_pool_route.py) > $w/foreign_pool_route.txt 2>&1; echo "foreign rc=$?" >> $w/env.txt
(cd py/gpu && CMA_RESULTS=$w/torch_routes.json timeout 240 python3 -m pytest -q -p no:cacheprovider torch_gpu_test.py 2>&1 | tail -25) > $w/route_tests.txt
PYTEST_PLUGINS=probe_plugin PROBE_OUT=$w timeout 120 python3 torch_conformance/run_conformance.py --out $w/each_prop --routes native,cma --orders each --only propagates_stream --total-s 110 --route-s 55 > $w/each_prop.log 2>&1
timeout 290 python3 torch_conformance/run_conformance.py --out $w/each_pools --routes cma --orders each --only TestMemPool:: --only test_graph_memory_stats_and_use_result --only test_graph_two_successive --total-s 280 --route-s 280 > $w/each_pools.log 2>&1
cp $w/env.txt $w/foreign_pool_route.txt $w/route_tests.txt $OUT/
tar czf $OUT/call1.tar.gz -C $w .
tail -5 $w/foreign_pool_route.txt; cat $w/route_tests.txt | tail -4; grep -h -A12 "| route" $w/each_prop/*.md $w/each_pools/*.md 2>/dev/null | head -40
