#!/usr/bin/env bash
# Session 6 of 2026-11-29, call 1 (one H200): (1) bench/cuda/late_discard_probe: do pages written
# right after a discard lose their contents when migrated to the host and back, with and without a
# fence behind the discard (issue 48's leading mechanism for the learned step's changed losses);
# (2) the GPU tests whose Python changed after session 5's last call (the kept optimizer state's
# review fixes; the routes that now set CMA_OPTIMIZER_STATE=host).
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
w=/tmp/w1; mkdir -p $w
timeout 120 $R/.gpu47/late_discard_probe --pages=256 --cycles=20 > $w/probe.json 2> $w/probe.err; cat $w/probe.json $w/probe.err
timeout 120 $R/.gpu47/late_discard_probe --pages=2048 --cycles=5 > $w/probe_4g.json 2>> $w/probe.err; cat $w/probe_4g.json
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
( cd $d && python3 -c "from cma.torch._ext import build; build.build()" > $w/build.log 2>&1 ); tail -1 $w/build.log
left=$((540 - SECONDS)); echo "tests get ${left} s"
( cd $d/gpu && PYTHONPATH=$d CMA_RESULTS=$w/tests.json timeout $left python3 -m pytest -q -rf -p no:cacheprovider \
   torch_gpu_test.py -k "keeps_the_state or staged_step or step_in_backward or offload_patterns" > $w/tests.txt 2>&1 )
tail -5 $w/tests.txt
tar czf $OUT/call1.tar.gz -C $w .
