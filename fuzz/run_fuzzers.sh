#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASAN + UBSAN) and runs each for a
# bounded time on its corpus in fuzz/corpus/<name> (new finds are added).
#   fuzz/run_fuzzers.sh [SECONDS_PER_FUZZER]   (default 60)
# Exits non-zero on the first crash, leak or invariant violation. For a long
# run with fresh arena-checker seeds and corpus merging: fuzz/long_fuzz.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fuzz/build_fuzzers.sh "$out"
for name in config trace sequence handshake collective checker away_checker; do
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
echo "fuzzers: 7 run, 0 failed"
