#!/usr/bin/env bash
# Builds the libFuzzer targets (config trace sequence handshake collective
# checker away_checker) and the arena checker's seed runner (arena_checker_seed) with clang,
# ASAN + UBSAN, into OUT. Each source is compiled once, on every core, and
# shared by the binaries that need it (the core is in four of them).
#   fuzz/build_fuzzers.sh OUT
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: fuzz/build_fuzzers.sh OUT}"
if ! command -v clang++ >/dev/null || ! dpkg-query -W libclang-rt-14-dev >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang libclang-rt-14-dev >&2
  else
    echo "build_fuzzers: needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
  fi
fi
./bazelw build //allocator //policy //bench:trace >/dev/null 2>&1 || true  # repository set-up
libdir=/usr/lib/$(gcc -print-multiarch)
absl=$(ls "$libdir"/libabsl_*.a | tr '\n' ' ')
mkdir -p "$out/obj"
# Coverage instrumentation everywhere; libFuzzer's main only where linked in.
export CMA_FUZZ_CFLAGS="-std=c++17 -O1 -g -fsanitize=fuzzer-no-link,address,undefined \
-fno-sanitize-recover=all -I. -D__HIP_PLATFORM_AMD__"
export CMA_FUZZ_OBJ="$out/obj"
core=(allocator/*.cc policy/*.cc backends/backend.cc backends/host/*.cc
      backends/fault/fault_injecting_backend.cc)
checker=(tests/arena_checker.cc tests/arena_checker_pools.cc tests/arena_checker_away.cc)
obj() { for s in "$@"; do echo "$out/obj/${s//\//_}.o"; done; }
printf '%s\n' "${core[@]}" allocator/symmetric/*.cc bench/trace.cc "${checker[@]}" fuzz/*.cc |
  xargs -P "$(nproc)" -I{} bash -c \
    'o="$CMA_FUZZ_OBJ/$(echo {} | tr / _).o"; clang++ $CMA_FUZZ_CFLAGS -c {} -o "$o" || exit 255'
link() {
  local name="$1" sanitize="$2"; shift 2
  clang++ -fsanitize="$sanitize" $(obj "$@") -Wl,--start-group $absl -Wl,--end-group \
    -lsodium -lz -lpthread -o "$out/$name"
}
fz=fuzzer,address,undefined
link config "$fz" fuzz/config_fuzzer.cc policy/*.cc
link trace "$fz" fuzz/trace_fuzzer.cc bench/trace.cc
link sequence "$fz" fuzz/sequence_fuzzer.cc "${core[@]}"
link handshake "$fz" fuzz/handshake_fuzzer.cc allocator/symmetric/wire.cc
link collective "$fz" fuzz/collective_fuzzer.cc allocator/symmetric/*.cc "${core[@]}"
link checker "$fz" fuzz/arena_checker_fuzzer.cc "${checker[@]}" "${core[@]}"
link away_checker "$fz" fuzz/away_checker_fuzzer.cc "${checker[@]}" "${core[@]}"
link arena_checker_seed address,undefined fuzz/arena_checker_seed.cc "${checker[@]}" "${core[@]}"
