#!/usr/bin/env bash
# Session 4 of 2026-11-29, call 4 (one H200): away_transport_bench with the
# new "dep" section (a transfer that waits for the busy kernel stream, or
# not, issued from the launching thread or a second one).
cd "$(dirname "$0")/../../.."
mkdir -p $OUT && timeout 300 .gpu47/away_transport_bench --mib=1024 --reps=3 > $OUT/away_transport_dep.json 2>$OUT/err.txt; echo rc=$?; cat $OUT/away_transport_dep.json; tail -3 $OUT/err.txt
