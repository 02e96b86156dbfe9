#!/usr/bin/env bash
# Builds the GPU binaries here (-c opt; Abseil, GoogleTest and cudart linked
# statically) and bundles them with the Python package, the traces and the
# scripts into a folder (default .gpu/, ignored by git) to copy to a GPU machine.
#   bench/gpu/package.sh [DEST]   then on the GPU machine: DEST/run_all.sh OUTDIR
# DEST also holds the wheel (//:wheel): DEST/wheel_gpu_check.sh DEST/*.whl OUTDIR
set -euo pipefail
cd "$(dirname "$0")/../.."
dest="${1:-.gpu}"
./bazelw build -c opt //bench:cma_bench //bench:link_limit //tests:backend_conformance_test //bench/cuda:all //tests/gpu:all \
  //integrations/c:libcma.so //:wheel
rm -rf "$dest" && mkdir -p "$dest/bench/traces" "$dest/py/cma" "$dest/py/gpu"
cp bazel-bin/bench/cma_bench bazel-bin/bench/link_limit bazel-bin/bench/cuda/link_duplex_bench \
   bazel-bin/tests/backend_conformance_test \
   bazel-bin/tests/gpu/cuda_gpu_test bazel-bin/tests/gpu/cuda_symmetric_test "$dest/"
cp bench/traces/*.csv.gz "$dest/bench/traces/"
cp bench/torch_move_bench.py bench/torch_replay.py bench/torch_train_bench.py bench/torch_sleep_bench.py \
   bench/torch_record_trace.py bench/torch_routes.py \
   bench/torch_alloc_pair_bench.py bench/torch_compile_decoder_bench.py bench/gpu/torch_alloc_suite.sh \
   bench/torch_sleep_levels_bench.py bench/torch_offload_bench.py bench/torch_dist_bench.py bench/torch_dist_report.py \
   bench/torch_oversub_bench.py bench/torch_record_step.py bench/torch_nvshmem_bench.py bench/torch_nccl_window_bench.py bench/oversub_blocker.py bench/oversub_report.py bench/gpu/oversub_suite.sh \
   bench/gpu/run_all.sh \
   bench/gpu/wheel_gpu_check.sh bazel-bin/cma_wheel/*.whl "$dest/"
mkdir -p "$dest/traces" && cp bench/traces/*.csv.gz "$dest/traces/"
# The package as it is laid out (cma/torch/, cma/torch/_ext/, cma/torch/training/):
# its .py, .cc and .h files (no __pycache__).
dest_py="$(cd "$dest/py" && pwd)"
(cd integrations/python && find cma -type f \( -name '*.py' -o -name '*.cc' -o -name '*.h' \) \
   -not -path '*/__pycache__/*' -exec cp --parents {} "$dest_py/" \;)
mkdir -p "$dest/py/cma/include" && cp integrations/c/cma_c.h "$dest/py/cma/include/"
cp integrations/python/gpu/*.py "$dest/py/gpu/"
cp bazel-bin/integrations/c/libcma.so "$dest/py/cma/"
# PyTorch's test_cuda.py conformance harness; PyTorch's file itself is not in
# git (bench/torch_conformance/README.md says how to get it) and is bundled
# when present.
mkdir -p "$dest/torch_conformance/shims" "$dest/torch_conformance/upstream"
cp bench/torch_conformance/*.py bench/torch_conformance/README.md "$dest/torch_conformance/"
cp bench/torch_conformance/shims/*.py "$dest/torch_conformance/shims/"
if [[ -f bench/torch_conformance/upstream/test_cuda.py ]]; then
  cp bench/torch_conformance/upstream/test_cuda.py "$dest/torch_conformance/upstream/"
else
  echo "note: no bench/torch_conformance/upstream/test_cuda.py: the conformance part cannot run"
fi
# libcma.so links Debian's shared Abseil and libsodium (their static archives
# are not PIC); the copies beside it are found through its $ORIGIN run path.
for lib in $(ldd bazel-bin/integrations/c/libcma.so | awk '/libabsl|libsodium/{print $3}'); do
  cp "$lib" "$dest/py/cma/"
done
chmod -R u+w "$dest"
echo "packaged into $dest ($(du -sh "$dest" | cut -f1))"
