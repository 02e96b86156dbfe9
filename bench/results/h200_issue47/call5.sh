#!/usr/bin/env bash
# Session 2026-11-28, call 5 (one H200, the device time's last minutes):
# the module zero_grad guard (review repro), the hint's patterns, and the
# torch_gpu_test cases call 3 had no time for (staged step and hint, three
# optimizer implementations each) on the package layout.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
logs=/tmp/logs; mkdir -p $logs
( cd $R/.gpu47/repro && PYTHONPATH=$d timeout 120 python3 sib_free_grads_module_zero_grad_false.py > $logs/repro_zero_grad.log 2>&1 ); tail -2 $logs/repro_zero_grad.log
( cd $d/gpu && timeout 60 python3 sib_patterns_route.py cma > $logs/sib.log 2>&1; echo "rc=$?" >> $logs/sib.log ); echo "sib: $(tail -1 $logs/sib.log) $(grep -c ^PASS $logs/sib.log) PASS"; grep ^FAIL $logs/sib.log
left=$((290 - SECONDS)); echo "pytest gets $left s"
( cd $d/gpu && timeout $left python3 -m pytest -q torch_gpu_test.py -k "oversubscription or step_in_backward" -rA > $logs/pytest.log 2>&1; echo "rc=$?" >> $logs/pytest.log ); grep -E "^(PASSED|FAILED)|passed|failed|rc=" $logs/pytest.log | tail -10
tar czf $OUT/call5_logs.tar.gz -C $logs .
