#!/bin/bash
# Run I: ways to wake right after a sleep (`sp gap`), the experiment built here with nvcc.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/env.txt 2>&1
uname -r >> $OUT/env.txt
timeout 200 ./sp gap > $OUT/sleep_phases_gap.txt 2>&1
echo "rc $?" >> $OUT/sleep_phases_gap.txt
