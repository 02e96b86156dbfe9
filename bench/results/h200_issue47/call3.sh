#!/usr/bin/env bash
# Session 2026-11-28, call 3 (one H200), after cma.torch became a package
# (issue 51) on top of issue 47's fixes: the package's extension compiled,
# the issue-47 routes, the zero-code start (python -m cma.torch, CMA_TORCH
# through the .pth hook), the GPU route tests of torch_gpu_test.py within
# the time left; then issue 48's limit tools: the link's duplex bandwidth,
# one recorded GPT-2 step (fused AdamW) and its limit.
# .gpu47 holds libcma.so (-c opt), its libraries, link_limit, link_duplex_bench.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch;print('torch',torch.__version__)"; } > $OUT/env.txt 2>&1
d=/tmp/new; mkdir -p $d/gpu; cp -r $R/integrations/python/cma $R/integrations/python/cma_torch.pth $d/
mkdir -p $d/cma/include && cp $R/integrations/c/cma_c.h $d/cma/include/
cp $R/.gpu47/lib/* $d/cma/; cp $R/integrations/python/gpu/*.py $d/gpu/
export CMA_LIBRARY=$d/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/ext_new
logs=/tmp/logs; mkdir -p $logs
( cd $d && python3 -c "import sys; sys.path.insert(0,'.'); from cma.torch._ext import build; build.build(); print('extension built')" > $logs/build.log 2>&1 ); tail -3 $logs/build.log
$R/.gpu47/link_duplex_bench --json=$OUT/link_duplex.json > $logs/duplex.log 2>&1; tail -12 $logs/duplex.log
for s in "sib_patterns_route.py cma" offload_patterns_route.py dataloader_route.py; do
  n=${s%%_*}; ( cd $d/gpu && timeout 200 python3 $s > $logs/$n.log 2>&1; echo "rc=$?" >> $logs/$n.log )
  echo "== $s: $(tail -1 $logs/$n.log) $(grep -c '^PASS' $logs/$n.log) PASS"; grep '^FAIL' $logs/$n.log | head -5
done
cat > /tmp/zc.py <<'PY'
import sys, torch, cma
t = torch.empty(1 << 20, device="cuda")
print("argv", sys.argv[1:], "__name__", __name__, "cma serves:", cma.stats(0)["allocated_bytes.all.current"] >= (4 << 20))
PY
( cd /tmp && PYTHONPATH=$d timeout 120 python3 -m cma.torch --conf "" /tmp/zc.py a b ) > $logs/zero_code.log 2>&1
mkdir -p /tmp/site && ln -sf $d/cma /tmp/site/cma && cp $d/cma_torch.pth /tmp/site/
( cd /tmp && CMA_TORCH=1 timeout 120 python3 -c "import site; site.addsitedir('/tmp/site'); import runpy; runpy.run_path('/tmp/zc.py', run_name='__main__')" ) >> $logs/zero_code.log 2>&1
cat $logs/zero_code.log | tail -4
left=$((420 - SECONDS)); echo "pytest gets ${left} s"
( cd $d/gpu && timeout $left python3 -m pytest -q torch_gpu_test.py -k "not two_gpus and not cupy and not mempool_with_another" \
   > $logs/pytest.log 2>&1; echo "rc=$?" >> $logs/pytest.log ); tail -6 $logs/pytest.log
left=$((570 - SECONDS)); echo "record gets ${left} s"
( cd $R/bench && PYTHONPATH=$d timeout $left python3 torch_record_step.py --fused --out $OUT/gpt2_fused_step.csv.gz > $logs/record.log 2>&1 ); tail -5 $logs/record.log
[[ -f $OUT/gpt2_fused_step.csv.gz ]] && $R/.gpu47/link_limit --step=$OUT/gpt2_fused_step.csv.gz --link_json=$OUT/link_duplex.json \
   --fractions=1,0.6667,0.3333 --json=$OUT/limit_fused.json > $logs/limit.log 2>&1; tail -20 $logs/limit.log
tar czf $OUT/call3_logs.tar.gz -C $logs .
