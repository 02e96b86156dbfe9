#!/usr/bin/env bash
# Session 2026-11-28, call 4 (one H200): after the review fixes, the
# issue-47 routes again and the reviewer's reproducers (.gpu47/repro, from
# an adversarial read of the PyTorch layer; each prints PASS/FAIL).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
logs=/tmp/logs; mkdir -p $logs
( cd $d && python3 -c "import sys; sys.path.insert(0,'.'); from cma.torch._ext import build; build.build(); print('extension built')" > $logs/build.log 2>&1 ); tail -2 $logs/build.log
for s in "sib_patterns_route.py cma" offload_patterns_route.py dataloader_route.py; do
  n=${s%%_*}; ( cd $d/gpu && timeout 150 python3 $s > $logs/$n.log 2>&1; echo "rc=$?" >> $logs/$n.log )
  echo "== $s: $(tail -1 $logs/$n.log) $(grep -c '^PASS' $logs/$n.log) PASS"; grep '^FAIL' $logs/$n.log | head -5
done
for f in $R/.gpu47/repro/[a-z]*.py; do
  n=$(basename $f .py); ( cd $R/.gpu47/repro && PYTHONPATH=$d timeout 90 python3 $f > $logs/repro_$n.log 2>&1; echo "rc=$?" >> $logs/repro_$n.log )
  echo "== repro $n: $(tail -1 $logs/repro_$n.log)"; grep -E '^(PASS|FAIL)' $logs/repro_$n.log | head -6
done
tar czf $OUT/call4_logs.tar.gz -C $logs .
