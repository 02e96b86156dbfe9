#!/bin/bash
# Run S (issue 21): the wake ordered after the driver's work behind the discards (`sp fence`).
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/env.txt 2>&1
timeout 200 ./sp fence > $OUT/sleep_phases_fence.txt 2>&1
echo "rc $?" >> $OUT/sleep_phases_fence.txt
