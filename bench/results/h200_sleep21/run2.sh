#!/bin/bash
# Issue 21, run 2: route checks again, the sleep benchmark after the overlap change, the offload demo.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; uname -r;
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"; } > $OUT/env.txt 2>&1
timeout 40 python3 py/gpu/sleep_levels_route.py > $OUT/sleep_levels_route.json 2> $OUT/errors.txt
timeout 40 python3 py/gpu/zero_copy_route.py > $OUT/zero_copy_route.json 2>> $OUT/errors.txt
timeout 140 python3 torch_sleep_levels_bench.py --timeout 65 --json $OUT/torch_sleep_levels.json > /dev/null 2>> $OUT/errors.txt
timeout 100 python3 torch_offload_bench.py --timeout 48 --json $OUT/torch_offload.json > /dev/null 2>> $OUT/errors.txt
echo done >> $OUT/env.txt
