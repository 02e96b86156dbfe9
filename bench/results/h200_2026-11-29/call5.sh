#!/usr/bin/env bash
# Session 2026-11-29, call 5 (one H200): the away state and the learned step
# through cma.torch (send_away / bring_back / memory_summary; a training loop
# under learn_step:1 with losses equal to the plain loop: away_route.py), and two routes
# of torch_gpu_test.py over the final core (training identical to PyTorch's
# allocator, the allocator interface).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
logs=/tmp/logs; mkdir -p $logs
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $logs/build.log 2>&1 ); tail -1 $logs/build.log
( cd $d/gpu && timeout 240 python3 away_route.py > $logs/away.log 2>&1; echo "rc=$?" >> $logs/away.log ); cat $logs/away.log
( cd $d/gpu && timeout 200 python3 -m pytest -q torch_gpu_test.py -k "routes_train_identically or allocator_interface" \
   > $logs/pytest.log 2>&1; echo "rc=$?" >> $logs/pytest.log ); tail -3 $logs/pytest.log
tar czf $OUT/call5_logs.tar.gz -C $logs .
