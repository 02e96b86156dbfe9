#!/usr/bin/env bash
# Issue 20 item 6, all three PyTorch allocator benchmarks in one command
# (under 10 minutes), from a folder made by bench/gpu/package.sh:
#   ./torch_alloc_suite.sh OUTDIR [--quick]
# Each benchmark runs native, expandable segments and cma's default route in
# fresh processes, 3 interleaved rounds with the order rotated, and has its
# own time budget (--budget: no process starts that would pass it), so the
# whole suite stays bounded even when a route hangs. Writes to OUTDIR:
#   env.txt
#   torch_alloc_pair.json/.txt   raw_alloc/raw_delete in C++, torch.empty+del from Python (pinned)
#   torch_train.json/.txt        the BERT training loop: step time, sampled physical peak
#   torch_decoder.json/.txt      torch.compile(reduce-overhead) decoder, static KV cache: tokens/s, peak
#   suite.log                    everything the three printed
set -u -o pipefail
cd "$(dirname "$0")"
out="${1:?usage: torch_alloc_suite.sh OUTDIR [--quick]}"
quick="${2:-}"
mkdir -p "$out"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CMA_DISABLE_MULTICAST=1
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
  nproc; python3 -c "import torch;print('torch',torch.__version__)"; } > "$out/env.txt" 2>&1
cat "$out/env.txt"
core=$(( $(nproc) > 6 ? 5 : $(nproc) - 1 ))
rc=0
timeout 140 python3 torch_alloc_pair_bench.py --rounds 3 --core "$core" --budget 130 $quick \
  --json "$out/torch_alloc_pair.json" 2>&1 | tee "$out/suite.log" || rc=1
timeout 150 python3 torch_train_bench.py --steps 30 --rounds 3 --budget 140 $quick \
  --json "$out/torch_train.json" 2>&1 | tee -a "$out/suite.log" || rc=1
timeout 250 python3 torch_compile_decoder_bench.py --rounds 3 --budget 235 $quick \
  --json "$out/torch_decoder.json" 2>&1 | tee -a "$out/suite.log" || rc=1
grep -h -E "^(verdict|PROBLEM)" "$out"/torch_*.txt
exit $rc
