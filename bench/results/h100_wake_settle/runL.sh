#!/bin/bash
# Run L (issue 21): run K again with the mark on a side stream (`sp mark`, way side+hold).
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/env.txt 2>&1
timeout 200 ./sp mark > $OUT/sleep_phases_mark.txt 2>&1
echo "rc $?" >> $OUT/sleep_phases_mark.txt
