#!/bin/bash
# Run R (issue 21): wake orders after the settle pause (`sp order`).
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/env.txt 2>&1
timeout 200 ./sp order > $OUT/sleep_phases_order.txt 2>&1
echo "rc $?" >> $OUT/sleep_phases_order.txt
