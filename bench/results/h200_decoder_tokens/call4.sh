#!/usr/bin/env bash
# Session 2026-11-27, call 4 (one H200): the decoder one process at a time, as when the
# difference was seen (sequential), cma twice as often as native.
set -u
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/torch_extensions PYTHONUNBUFFERED=1
w=/tmp/wc4; mkdir -p $w
python3 hunt.py $w/hunt_sequential.json --seconds 330 --parallel 1 --variants cma,native,cma > $w/hunt_seq.log 2>&1
cp $w/hunt_sequential.json $OUT/; tail -3 $w/hunt_seq.log
