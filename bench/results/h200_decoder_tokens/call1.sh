#!/usr/bin/env bash
# Session 2026-11-27, call 1 (one H200): the decoder's token check, many processes per
# variant (hunt.py), and the discard-then-populate probe. The first cma process
# compiles cma.torch's glue (the last session's uncompiled edits).
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/w; mkdir -p $w
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader; python3 -c "import torch;print(torch.__version__)"; } > $w/env.txt 2>&1
timeout 150 python3 torch_compile_decoder_bench.py --routes native,cma --rounds 1 --timeout 120 --budget 140 --json $w/dec_prep.json > $w/dec_prep.log 2>&1
echo "prep rc=$?" >> $w/env.txt
timeout 60 python3 discard_reuse_probe.py 30 > $w/probe_cma.txt 2>&1
timeout 40 python3 discard_reuse_probe.py 12 native > $w/probe_native.txt 2>&1
python3 hunt.py $w/hunt.json --seconds 270 --parallel 6 > $w/hunt.log 2>&1
cp $w/env.txt $w/hunt.json $w/probe_cma.txt $w/probe_native.txt $OUT/
tar czf $OUT/call1.tar.gz -C $w . /tmp/torch_extensions 2>/dev/null
cat $w/env.txt; tail -3 $w/dec_prep.log; cat $w/probe_cma.txt $w/probe_native.txt | tail -4; tail -6 $w/hunt.log
