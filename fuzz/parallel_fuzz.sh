#!/usr/bin/env bash
# The long fuzz (fuzz/long_fuzz.sh) spread over a many-core machine: every
# libFuzzer target on a core of its own for the whole DURATION, and the arena
# checker's fresh random seeds on every other core, from binaries built
# elsewhere by fuzz/build_fuzzers.sh (statically linked: they run on the GPU
# machine, whose cores are otherwise idle). Its CPU time is DURATION times the
# cores used; long_fuzz.sh's is DURATION times two.
#   fuzz/parallel_fuzz.sh DURATION_S BIN_DIR LOG_DIR [CORES]
# LOG_DIR gets work/<fuzzer>/ (the new corpus entries, to merge into
# fuzz/corpus/<fuzzer> with the binary's -merge=1 where it was built),
# artifacts/<fuzzer>/ (crash-*, leak-*, timeout-*, oom-*), checker/failures
# (seed and exit code of each failed seed; its log beside it) and
# summary.txt. Exits 1 if anything was found.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds="${1:?usage: fuzz/parallel_fuzz.sh DURATION_S BIN_DIR LOG_DIR [CORES]}"
bin="${2:?BIN_DIR}"
log_dir="${3:?LOG_DIR}"
cores="${4:-$(nproc)}"
steps=2500
fuzzers=(config trace sequence handshake collective checker away_checker)
mkdir -p "$log_dir/checker" "$log_dir/fuzzers"
deadline=$(($(date +%s) + seconds))

for name in "${fuzzers[@]}"; do
  work="$log_dir/work/$name" art="$log_dir/artifacts/$name"
  mkdir -p "$work" "$art"
  # Reads fuzz/corpus/<name>, writes new entries to work/ only.
  "$bin/$name" "$work" "fuzz/corpus/$name" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$art/" \
    >"$log_dir/fuzzers/$name.log" 2>&1 &
done

checker_loop() {
  local seed rc
  while [[ $(date +%s) -lt $deadline ]]; do
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    timeout $((deadline - $(date +%s) + 120)) "$bin/arena_checker_seed" "$seed" "$steps" \
      >"$log_dir/checker/$seed.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then
      rm -f "$log_dir/checker/$seed.log"
      echo ok >>"$log_dir/checker/passed.$1"
    elif [[ $rc -ne 124 ]]; then  # not cut short by the deadline
      echo "$seed $rc" >>"$log_dir/checker/failures"
    else
      rm -f "$log_dir/checker/$seed.log"
    fi
  done
}
for ((c = ${#fuzzers[@]}; c < cores; ++c)); do checker_loop "$c" & done
wait

found=0
summary="$log_dir/summary.txt"
{
  echo "parallel_fuzz: $(date -u +%FT%TZ), ${seconds} s on ${cores} cores"
  printf '%-13s %12s %11s %8s\n' fuzzer execs new_entries artifacts
  for name in "${fuzzers[@]}"; do
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log_dir/fuzzers/$name.log" |
            tail -1 | grep -o '[0-9]*$')
    arts=$(ls "$log_dir/artifacts/$name" | wc -l)
    printf '%-13s %12s %11s %8s\n' "$name" "${execs:-?}" "$(ls "$log_dir/work/$name" | wc -l)" \
      "$arts"
  done
  seeds=$(cat "$log_dir"/checker/passed.* 2>/dev/null | wc -l)
  touch "$log_dir/checker/failures"
  echo "arena checker: $seeds seeds passed, $(wc -l <"$log_dir/checker/failures") failed" \
    "(${steps} steps each)"
  sed 's/^/  failed: /' "$log_dir/checker/failures"
} >"$summary"
cat "$summary"
# Anything found: an artifact of a fuzzer or a failed seed.
if [[ -n $(find "$log_dir/artifacts" -type f) || -s "$log_dir/checker/failures" ]]; then
  found=1
fi
exit "$found"
