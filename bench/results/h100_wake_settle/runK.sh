#!/bin/bash
# Run K (issue 21): does a host function after the sleep's discards lengthen the sleep (`sp mark`)?
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/env.txt 2>&1
timeout 200 ./sp mark > $OUT/sleep_phases_mark.txt 2>&1
echo "rc $?" >> $OUT/sleep_phases_mark.txt
