#!/usr/bin/env bash
# Session 5 of 2026-11-29, call 5 (one H200, the machine still warm from call 4, so /tmp/new from
# call4.sh was there): call 4's no-discard route again, its abseil and libsodium libraries now beside
# the diagnostic libcma.so (call 4 could not load it). The diagnostic build was this session's commit
# 30b3195b's parent with backends/cuda/cuda_managed.cc's DiscardBatch returning at once and
# DiscardAndPrefetchBatch doing PrefetchBatch while CMA_DEBUG_NO_DISCARD is set (not committed).
# The command as run (the run tool's one line, wrapped here):
d=/tmp/new; cp .gpu47/lib/libabsl* .gpu47/lib/libsodium* $d/nodiscard/ && export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext_new && w=/tmp/w5 && mkdir -p $w && cd bench && \
CMA_DEBUG_NO_DISCARD=1 CMA_LIBRARY=$d/nodiscard/libcma.so PYTHONPATH=$d timeout 190 python3 torch_oversub_bench.py --layers 16 --width 2048 --heads 16 --batch 4 --seq 512 --steps 5 --warmup 2 --ratios 2.0 --route-time 45 --setup-timeout 120 --plain-steps 3 --cma-conf oversubscribe:1,device_headroom:512M,managed_budget:{budget_gib}G --fused --routes cma_oversub_learn_core --json $w/nodiscard_2x.json > $w/nodiscard_2x.log 2>&1; grep "cma_oversub\|inmem" $w/nodiscard_2x.log | tail -2; tail -3 $w/nodiscard_2x.log; cp $w/* $OUT/
