#!/usr/bin/env bash
# A/B of the decoder's token check: this commit's libcma.so (new) against d8d07ca's (old).
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/w3; mkdir -p $w
first=""
for i in 1 2 3 4 5; do
  for v in new old; do
    if [ $v = new ]; then export CMA_LIBRARY=$PWD/py/cma/libcma.so; else export CMA_LIBRARY=$PWD/old/libcma.so; fi
    timeout 70 python3 torch_compile_decoder_bench.py --routes cma --rounds 1 --timeout 60 --budget 60 $first --json $w/dec_${v}_$i.json > $w/dec_${v}_$i.log 2>&1
    first="--no-prepare"
    python3 -c "
import json,sys
d=json.load(open('$w/dec_${v}_$i.json'))
for r in d['run']['results']['cma']: print('$v', $i, r['check']['tokens_sha256_16'][:3], r['metrics']['decode_tokens_per_s'], r['problems'])
" 2>&1 | tail -1
  done
done
tar czf $OUT/call3.tar.gz -C $w .
