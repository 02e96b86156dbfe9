#!/usr/bin/env bash
# The long fuzzing run to make before resolving an issue that touches the
# allocator's core (README.md). For DURATION of wall time (the build before it
# not counted):
#  * each libFuzzer target of fuzz/run_fuzzers.sh fuzzes for an equal share,
#    one after another, from fuzz/corpus/<name> into a scratch corpus, going on
#    after a crash (at most 5 per target); then fuzz/corpus/<name> and the
#    new finds are minimised together with -merge=1 into fuzz/corpus/<name>
#    (the fewest inputs that keep every feature; "dropped" counts the old
#    entries this made redundant);
#  * meanwhile, on another core, the arena checker runs fresh random seeds
#    (fuzz/arena_checker_seed.cc; the seed picks the configuration);
#  * crash-* and leak-* inputs join fuzz/corpus/<name>, so that
#    fuzz/run_fuzzers.sh (CI) replays them until they pass, and are printed;
#    timeout-* and oom-* inputs are reported and stay in the log directory.
# The summary (per fuzzer: runs, execs, new corpus entries, crashes; checker:
# seeds tried, each failure with the command that reproduces it) goes to
# LOG_DIR/summary.txt and to stdout. Exits 1 if anything was found, 2 on a
# usage or build error.
#   fuzz/long_fuzz.sh DURATION [--log-dir DIR] [--checker-steps N] [--prebuilt DIR]
#   fuzz/long_fuzz.sh --seconds N [...]
# DURATION: seconds (3600) or with a unit (90s, 45m, 1h, 1.5h).
# LOG_DIR defaults to /tmp/cma_long_fuzz_<date>; it keeps the binaries, so
# the commands in the summary reproduce each finding. --prebuilt DIR uses the
# binaries of an earlier fuzz/build_fuzzers.sh DIR (or LOG_DIR/bin) instead of
# building them again.
set -uo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
duration="" log_dir="" steps=2500 prebuilt=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) duration="${2:-}"; shift 2 ;;
    --log-dir) log_dir="${2:-}"; shift 2 ;;
    --checker-steps) steps="${2:-}"; shift 2 ;;
    --prebuilt) prebuilt="${2:-}"; shift 2 ;;
    -h|--help) usage ;;
    *) [[ -z "$duration" ]] || usage; duration="$1"; shift ;;
  esac
done
seconds=$(python3 - "$duration" <<'PY'
import re, sys
m = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", sys.argv[1])
print(int(float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]) if m else 0)
PY
)
[[ "$seconds" -ge 12 && "$steps" =~ ^[0-9]+$ && "$steps" -gt 0 ]] || usage
log_dir="${log_dir:-/tmp/cma_long_fuzz_$(date +%Y%m%d_%H%M%S)}"
mkdir -p "$log_dir"/{fuzzers,artifacts,work,checker}
bin="$log_dir/bin"
if [[ -n "$prebuilt" ]]; then
  bin=$(cd "$prebuilt" && pwd) || exit 2
elif echo "long_fuzz: building into $bin" >&2 &&
  ! fuzz/build_fuzzers.sh "$bin" >"$log_dir/build.log" 2>&1; then
  tail -20 "$log_dir/build.log" >&2
  echo "long_fuzz: build failed (see $log_dir/build.log)" >&2
  exit 2
fi

fuzzers=(config trace sequence handshake collective checker away_checker)
share=$((seconds / ${#fuzzers[@]}))
start=$(date +%s)
deadline=$((start + seconds))

# The checker's loop, in the background: one fresh seed per run until the
# deadline, each run's output kept only when it failed.
checker_loop() {
  local n=0 seed rc
  while [[ $(date +%s) -lt $deadline ]]; do
    seed=$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')
    n=$((n + 1))
    timeout 600 "$bin/arena_checker_seed" "$seed" "$steps" >"$log_dir/checker/$seed.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then
      rm -f "$log_dir/checker/$seed.log"
    else
      echo "$seed $rc" >>"$log_dir/checker/failures"
    fi
    echo "$n" >"$log_dir/checker/seeds"
  done
}
checker_loop &
checker_pid=$!
trap 'kill "$checker_pid" 2>/dev/null' EXIT

found=0
summary="$log_dir/summary.txt"
{
  echo "long_fuzz: $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), ${seconds} s:"
  echo "${#fuzzers[@]} fuzzers x ${share} s, arena checker alongside; logs in $log_dir"
  printf '%-11s %5s %12s %11s %8s %8s %14s\n' fuzzer runs execs new_corpus dropped crashes \
    timeouts/ooms
} >"$summary"
findings=""
for name in "${fuzzers[@]}"; do
  corpus="fuzz/corpus/$name" work="$log_dir/work/$name" art="$log_dir/artifacts/$name"
  mkdir -p "$corpus" "$work" "$art"
  echo "== fuzzing $name for ${share}s" >&2
  until_t=$(($(date +%s) + share))
  runs=0 execs=0 rc=0
  while left=$((until_t - $(date +%s))); [[ $left -gt 0 ]]; do
    runs=$((runs + 1))
    log="$log_dir/fuzzers/$name.$runs.log"
    "$bin/$name" "$work" "$corpus" -max_total_time="$left" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$art/" >"$log" 2>&1
    rc=$?
    n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
    [[ -n "$n" ]] || n=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
    execs=$((execs + ${n:-0}))
    grep -E "^(==[0-9]+==ERROR|SUMMARY)" "$log" | head -3 >&2
    [[ $rc -eq 0 ]] && break
    if [[ $(ls "$art" | wc -l) -ge 5 ]]; then break; fi
    if [[ -z $(ls -A "$art") ]]; then  # failed with nothing to show: do not loop on it
      findings+="$name exited $rc without an input (see $log)"$'\n'
      found=1
      break
    fi
  done
  # Minimised: the fewest inputs of the old corpus and the new finds that
  # keep every feature either had (entries are named by their SHA-1).
  min="$log_dir/min/$name"
  mkdir -p "$min"
  if "$bin/$name" -merge=1 -timeout=10 -rss_limit_mb=2048 "$min" "$corpus" "$work" \
    >"$log_dir/fuzzers/$name.merge.log" 2>&1 && [[ -n $(ls -A "$min") ]]; then
    new=$(comm -13 <(ls "$corpus" | sort) <(ls "$min" | sort) | wc -l)
    dropped=$(comm -23 <(ls "$corpus" | sort) <(ls "$min" | sort) | wc -l)
    find "$corpus" -maxdepth 1 -type f -delete
    cp "$min"/* "$corpus/"
  else
    new=0 dropped=0
    findings+="$name: merge failed, corpus left as it was (see $log_dir/fuzzers/$name.merge.log)"$'\n'
    found=1
  fi
  crashes=0 other=0
  for f in "$art"/*; do
    [[ -e "$f" ]] || continue
    case "$(basename "$f")" in
      crash-*|leak-*)
        crashes=$((crashes + 1))
        cp "$f" "$corpus/"
        findings+="$name: $(basename "$f") -> $corpus/ (reproduce: $bin/$name $f)"$'\n'
        echo "$name found $(basename "$f"):" >&2
        od -A d -t x1z "$f" | head -8 >&2 ;;
      *)
        other=$((other + 1))
        findings+="$name: $(basename "$f") kept in $art (reproduce: $bin/$name $f)"$'\n' ;;
    esac
  done
  [[ $((crashes + other)) -eq 0 ]] || found=1
  printf '%-11s %5d %12d %11d %8d %8d %14d\n' "$name" "$runs" "$execs" "$new" "$dropped" \
    "$crashes" "$other" >>"$summary"
done
wait "$checker_pid"
trap - EXIT
seeds=$(cat "$log_dir/checker/seeds" 2>/dev/null || echo 0)
failures=0
if [[ -f "$log_dir/checker/failures" ]]; then
  while read -r seed rc; do
    failures=$((failures + 1))
    why=$(grep -m1 -E "FAILED|ERROR|runtime error" "$log_dir/checker/$seed.log")
    findings+="arena checker seed $seed (exit $rc): ${why:-see $log_dir/checker/$seed.log}"$'\n'
    findings+="  reproduce: $bin/arena_checker_seed $seed $steps"$'\n'
  done <"$log_dir/checker/failures"
  found=1
fi
{
  echo "arena checker: $seeds seeds tried ($steps steps each), $failures failed"
  if [[ -n "$findings" ]]; then printf 'found:\n%s' "$findings"; else echo "found: nothing"; fi
  echo "wall time: $(($(date +%s) - start)) s"
} >>"$summary"
cat "$summary"
exit "$found"
