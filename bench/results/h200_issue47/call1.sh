#!/usr/bin/env bash
# Issue 47, call 1 (one H200): the new GPU routes of the PyTorch layer
# (sib_patterns_route, offload_patterns_route, dataloader_route) on the fixed
# package ("new", this commit) and on the package before the fixes ("old",
# 70e4553, carried in .gpu47/old), # .gpu47/lib holds libcma.so -c opt and the libraries beside it.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; git -C $R log -1 --format=%H 2>/dev/null; } > $OUT/env.txt 2>&1
for v in new old; do
  d=/tmp/$v; mkdir -p $d/gpu
  if [[ $v == new ]]; then cp -r $R/integrations/python/cma $d/; else cp -r $R/.gpu47/old/integrations/python/cma $d/; fi
  mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
  cp $R/.gpu47/lib/* $d/cma/
  cp $R/integrations/python/gpu/*.py $d/gpu/
done
logs=/tmp/logs; mkdir -p $logs
run() {  # variant name timeout args...
  local v=$1 name=$2 t=$3; shift 3
  ( cd /tmp/$v/gpu && CMA_LIBRARY=/tmp/$v/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_$v \
      timeout $t python3 "$@" > $logs/${v}_$name.log 2>&1; echo "rc=$?" >> $logs/${v}_$name.log )
  echo "== $v $name: $(tail -1 $logs/${v}_$name.log) $(grep -c '^PASS' $logs/${v}_$name.log) PASS $(grep -c '^FAIL' $logs/${v}_$name.log) FAIL"
}
# Compile each variant's extension once, both at once.
for v in new old; do
  ( cd /tmp/$v/gpu && CMA_LIBRARY=/tmp/$v/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_$v \
    python3 -c "import sys; sys.path.insert(0,'..'); import cma.torch_allocator as a; a.build()" > $logs/${v}_build.log 2>&1 ) &
done
wait
tail -3 $logs/*_build.log
for v in new old; do
  run $v sib_cma 240 sib_patterns_route.py cma
  run $v offload 240 offload_patterns_route.py
  run $v dataloader 150 dataloader_route.py
done
run new sib_native 200 sib_patterns_route.py
grep -h "^FAIL" $logs/new_*.log | head -40
tar czf $OUT/call1_logs.tar.gz -C $logs .
