#!/usr/bin/env bash
# Session 2026-11-29 (second), call 1 (one H200): issue 50 on the GPU. The
# extension compiled with this session's glue (live settings, the settings
# follower, the snapshot's host marks, not-a-capture pool contexts, free
# blocks' last request); torch_gpu_test.py's routes that touch them (training
# in a MemPool, graphs and compiled graphs in a MemPool, settings, RFC-0023
# names, host memory in the snapshot, memory plots alone, allocator
# interface, PyTorch's tools, the default DataLoader under the switch).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
logs=/tmp/logs; mkdir -p $logs
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $logs/build.log 2>&1 ); tail -3 $logs/build.log
( cd $d/gpu && timeout 420 python3 -m pytest -q torch_gpu_test.py -k "settings or rfc or host_allocations or memory_plots or routes_train_identically or graphs_and_compiled or failed_capture or memory_tools or allocator_interface or default_dataloader" \
   > $logs/pytest.log 2>&1; echo "rc=$?" >> $logs/pytest.log ); tail -15 $logs/pytest.log
grep -E "^(E |FAILED)" $logs/pytest.log | head -30
tar czf $OUT/call1_logs.tar.gz -C $logs .
