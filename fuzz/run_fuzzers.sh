#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASAN + UBSAN) and runs each for a
# bounded time on its corpus in fuzz/corpus/<name> (new finds are added).
#   fuzz/run_fuzzers.sh [SECONDS_PER_FUZZER]   (default 60)
# Exits non-zero on the first crash, leak or invariant violation.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
if ! command -v clang++ >/dev/null || ! dpkg-query -W libclang-rt-14-dev >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang libclang-rt-14-dev >&2
  else
    echo "run_fuzzers: needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
  fi
fi
./bazelw build //allocator //policy //bench:trace >/dev/null 2>&1 || true  # repository set-up
libdir=/usr/lib/$(gcc -print-multiarch)
absl=$(ls "$libdir"/libabsl_*.a | tr '\n' ' ')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
flags=(-std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. -D__HIP_PLATFORM_AMD__)
link=(-Wl,--start-group $absl -Wl,--end-group -lsodium -lz -lpthread)
core=(allocator/*.cc policy/*.cc backends/backend.cc backends/host/*.cc
      backends/fault/fault_injecting_backend.cc)
build() { clang++ "${flags[@]}" "$@" "${link[@]}"; }
build fuzz/config_fuzzer.cc policy/*.cc -o "$out/config"
build fuzz/trace_fuzzer.cc bench/trace.cc -o "$out/trace"
build fuzz/sequence_fuzzer.cc "${core[@]}" -o "$out/sequence"
build fuzz/handshake_fuzzer.cc allocator/symmetric/wire.cc -o "$out/handshake"
build fuzz/collective_fuzzer.cc allocator/symmetric/*.cc "${core[@]}" -o "$out/collective"
build fuzz/arena_checker_fuzzer.cc tests/arena_checker.cc tests/arena_checker_pools.cc "${core[@]}" \
  -o "$out/checker"
for name in config trace sequence handshake collective checker; do
  mkdir -p "fuzz/corpus/$name"
  echo "== fuzzing $name for ${seconds}s"
  "$out/$name" "fuzz/corpus/$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 2>&1 | grep -E "^(#|==|stat::number_of_executed_units|stat::peak_rss|INFO: (Running|Done))|ERROR|SUMMARY|crash-|leak-" | tail -8
  # libFuzzer's own exit status is lost in the pipe above: check it separately.
  if ls crash-* leak-* timeout-* 2>/dev/null | grep -q .; then
    echo "run_fuzzers: $name found a failure (see crash-*/leak-* files)" >&2
    exit 1
  fi
done
echo "fuzzers: 6 run, 0 failed"
