#!/bin/bash
# Run E (issue 20): cma's PyTorch route tests alone (run C's 170 s limit cut
# them short after 17 tests), in the bundle of bench/gpu/package.sh.
cd "$(dirname "$0")"
export PYTHONPATH=$PWD/py CMA_LIBRARY=$PWD/py/cma/libcma.so TORCH_EXTENSIONS_DIR=/tmp/te
cd py/gpu && CMA_RESULTS=$OUT/torch_routes.json timeout 480 python3 -m pytest -v -p no:cacheprovider \
  torch_gpu_test.py > $OUT/torch_gpu_pytest.txt 2>&1
