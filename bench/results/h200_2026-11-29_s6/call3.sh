#!/usr/bin/env bash
# Session 6 of 2026-11-29, call 3 (two H200s): native's allocation traces of FSDP2 GPT-2 and
# Llama per rank from the model's move to the device on (call 2's began at the first step, which
# the host backend's replay could not match to cma's FSDP2 footprint on the GPU), for replay.
set -u
cd "$(dirname "$0")/../../.."
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/env.txt 2>&1
w=/tmp/w3; mkdir -p $w/logs $w/traces
S="--layers 16 --width 1024 --heads 16 --vocab 50304 --batch 4 --seq 512 --warmup 2"
timeout 150 python3 bench/torch_dist_bench.py $S --steps 6 --routes native --mode fsdp2,ddp --model gpt2,llama \
  --timeout 35 --record-trace $w/traces --json $w/trace.json --log-dir $w/logs > $w/trace.log 2>&1
echo "trace rc $?"; grep "^| " $w/trace.md; ls -la $w/traces
tar czf $OUT/call3.tar.gz -C $w .
