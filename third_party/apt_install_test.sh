#!/usr/bin/env bash
# third_party/apt_install.sh against a fake apt-get: waits while the lock is
# held (with a message), gives up at its timeout, and does not retry other
# failures.
set -uo pipefail
script="${TEST_SRCDIR:-$(dirname "$0")/..}/${TEST_WORKSPACE:-cma}/third_party/apt_install.sh"
[[ -f $script ]] || script="$(cd "$(dirname "$0")" && pwd)/apt_install.sh"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/apt.XXXXXX")"
mkdir -p "$tmp/bin"
# The fake apt-get logs its arguments; `update` fails with apt's lock message
# while $tmp/held_updates (a count) is positive, or always with HOLD=forever.
cat > "$tmp/bin/apt-get" <<'FAKE'
#!/usr/bin/env bash
echo "$*" >> "$FAKE_DIR/calls"
if [[ " $* " == *" update "* ]]; then
  n=$(cat "$FAKE_DIR/held_updates" 2>/dev/null || echo 0)
  if [[ ${HOLD:-} == forever || $n -gt 0 ]]; then
    echo $((n - 1)) > "$FAKE_DIR/held_updates"
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 42 (apt-get)"
    exit 100
  fi
fi
if [[ " $* " == *" install "* && ${MISSING:-} == 1 ]]; then
  echo "E: Unable to locate package nosuchpackage"; exit 100
fi
exit 0
FAKE
chmod +x "$tmp/bin/apt-get"
fail() { echo "FAIL: $*"; cat "$tmp/calls" "$tmp/err" 2>/dev/null; exit 1; }
run() {  # env... -- args: runs the script with the fake first on PATH
  rm -f "$tmp/calls" "$tmp/err"
  env PATH="$tmp/bin:$PATH" FAKE_DIR="$tmp" BAZELW_APT_LOCK_RETRY=0.2 "$@" bash "$script" \
    python3-venv python3-numba 2> "$tmp/err"
}

echo 2 > "$tmp/held_updates"
run BAZELW_APT_LOCK_TIMEOUT=30 || fail "lock held twice: exit $?"
grep -q "holds the package lock; waiting up to" "$tmp/err" || fail "no waiting message"
[[ $(grep -c " update" "$tmp/calls") -eq 3 ]] || fail "update not retried until the lock was free"
grep -q "DPkg::Lock::Timeout=[0-9]* install -y -q --no-install-recommends python3-venv python3-numba" \
  "$tmp/calls" || fail "install not run with the lock timeout and the packages"
echo "ok: waits for a held lock, then installs"

start=$SECONDS
run HOLD=forever BAZELW_APT_LOCK_TIMEOUT=2 && fail "a lock held past the timeout succeeded"
((SECONDS - start <= 10)) || fail "waited $((SECONDS - start)) s with a 2 s timeout"
grep -q "still held after 2 s; giving up" "$tmp/err" || fail "no give-up message"
grep -q " install " "$tmp/calls" && fail "installed although update never ran"
echo "ok: gives up after the timeout with apt's status"

echo 0 > "$tmp/held_updates"
run MISSING=1 BAZELW_APT_LOCK_TIMEOUT=30 && fail "a missing package succeeded"
[[ $(grep -c " install " "$tmp/calls") -eq 1 ]] || fail "a failure other than the lock was retried"
grep -q "waiting" "$tmp/err" && fail "waited for a lock nobody held"
echo "ok: other failures come back at once"
