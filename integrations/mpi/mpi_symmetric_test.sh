#!/usr/bin/env bash
# Runs the MPI symmetric test with 2, 3 and 4 ranks on this host.
set -euo pipefail
bin="$1"
for n in 2 3 4; do
  echo "== $n ranks"
  # Shared memory and loopback only; root is allowed (CI runs as root).
  OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_vader_single_copy_mechanism=none \
  OMPI_MCA_plm_rsh_agent=false OMPI_MCA_rmaps_base_oversubscribe=1 \
    timeout 120 mpirun --allow-run-as-root --oversubscribe -np "$n" "$bin"
done
echo "3 passed, 0 failed"
