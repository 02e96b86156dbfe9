#!/usr/bin/env bash
# Session 2026-11-29, call 1 (one H200): issue 51's routes on the package
# layout, through the wheel (installed into a fresh venv, no PYTHONPATH):
# CuPy, a MemPool over another allocator, the allocator interface, memory
# tools, moves, stats, the CPU switch and its DataLoader, sleep; and the
# Numba suite.
set -u
cd "$(dirname "$0")/../../.."
export NCCL_NVLS_ENABLE=0 CMA_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export WHEEL_CHECK_K="cupy_route or another_allocator or allocator_interface or memory_tools or move_round_trip or move_of_memory or statistics or managed_cpu_switch or zero_copy or default_dataloader or sleep_and_wake or record_stream or uncached"
timeout 560 bench/gpu/wheel_gpu_check.sh .gpu47/wheel/*.whl /tmp/wheel_out
echo "rc=$?"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" /tmp/wheel_out/torch.txt | tail -20
tar czf $OUT/call1_wheel.tar.gz -C /tmp/wheel_out .
