#!/usr/bin/env bash
# Session 2026-11-29 (second), call 6 (one H200's 16 CPU cores): the long
# fuzz of the core after this session's pool change, spread over the cores
# (fuzz/parallel_fuzz.sh): 7 libFuzzer targets for 340 s each on a core of
# their own, the arena checker's random seeds on the other 9. Binaries:
# fuzz/build_fuzzers.sh /tmp/fuzzbin here (the core of d8d8e1b: 14078c9 and 717c6ef, unchanged since;
# ASAN+UBSAN, debug info stripped), carried as .gpu47/fuzzbin.tar.xz.
set -u
cd "$(dirname "$0")/../../.."
R=$PWD
mkdir -p /tmp/fz && tar xJf $R/.gpu47/fuzzbin.tar.xz -C /tmp/fz
export LD_LIBRARY_PATH=$R/.gpu47/lib
fuzz/parallel_fuzz.sh 340 /tmp/fz/bin $OUT/fuzz 16
echo "rc=$?"
tar czf $OUT/fuzz.tar.gz -C $OUT fuzz && rm -rf $OUT/fuzz
