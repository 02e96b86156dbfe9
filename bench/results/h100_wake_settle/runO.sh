#!/bin/bash
# Run O (issue 21): run N again with each cycle's statistics;: which processes sleep slowly, and where their pinned
# staging lives: torch_wake_settle_probe.py 4 in six fresh processes (the
# default config), each reporting its big mappings' NUMA nodes and page
# sizes after the first sleep; the host's NUMA layout and the GPU's node.
cd "$(dirname "$0")"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv; uname -r; nproc;
  lscpu | grep -i -E "numa|socket|model name"; nvidia-smi topo -m;
  cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag;
  grep -i huge /proc/meminfo; } > $OUT/env.txt 2>&1
for d in /sys/bus/pci/devices/*; do [[ -f $d/vendor && $(cat $d/vendor) == 0x10de && $(cat $d/class) == 0x030200 ]] && echo "gpu $d numa_node $(cat $d/numa_node)" >> $OUT/env.txt; done
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
python3 -c "import cma.torch" 2>/dev/null
for p in 1 2 3 4 5 6; do
  CMA_ALLOC_CONF=managed_budget:16G timeout 60 python3 torch_wake_settle_probe.py 4 > /tmp/r.txt 2>>$OUT/errors.txt
  echo "{\"process\": $p, \"result\": $(tail -1 /tmp/r.txt)}" >> $OUT/probe.jsonl
done
echo done >> $OUT/env.txt
