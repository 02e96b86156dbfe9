#!/usr/bin/env bash
# Is the decoder's rare token difference cma's? Native and cma interleaved, one process each.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1 CMA_LIBRARY=$PWD/py/cma/libcma.so
w=/tmp/w4; mkdir -p $w
timeout 100 python3 torch_compile_decoder_bench.py --routes native,cma --rounds 1 --timeout 80 --budget 90 --json $w/dec_0.json > $w/dec_0.log 2>&1
for i in 1 2 3 4 5 6 7 8; do
  timeout 60 python3 torch_compile_decoder_bench.py --routes native,cma --rounds 1 --timeout 50 --budget 55 --no-prepare --json $w/dec_$i.json > $w/dec_$i.log 2>&1
  python3 -c "
import json
d=json.load(open('$w/dec_$i.json'))
for rt,rs in d['run']['results'].items():
  for r in rs: print($i, rt, [x[:6] for x in r['check']['tokens_sha256_16']])
" 2>&1 | tail -2
done
tar czf $OUT/call4.tar.gz -C $w .
