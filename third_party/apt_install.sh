#!/usr/bin/env bash
# Installs Debian packages for ./bazelw (as root), waiting for the package
# lock when another apt/dpkg holds it, as a fresh machine's unattended
# upgrades do at boot.
#   third_party/apt_install.sh PACKAGE...
# Contract: runs `apt-get update` then `apt-get install --no-install-recommends`.
# While another process holds a package lock it says so on stderr and waits,
# in all at most $BAZELW_APT_LOCK_TIMEOUT seconds (default 600), then goes on;
# past that, apt's own error and exit status come back. Any other failure
# comes back at once.
# Why two mechanisms: apt's DPkg::Lock::Timeout makes `install` wait for the
# dpkg lock (printing whose it is), but `apt-get update` takes the lists lock,
# which that option does not cover, so update is retried while it reports a
# held lock.
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive
timeout_s="${BAZELW_APT_LOCK_TIMEOUT:-600}"
retry_s="${BAZELW_APT_LOCK_RETRY:-5}"
deadline=$((SECONDS + timeout_s))
out=$(mktemp)
trap 'rm -f "$out"' EXIT

apt_get() {
  local said=0 rc left
  while :; do
    left=$((deadline - SECONDS))
    ((left < 0)) && left=0
    apt-get -o DPkg::Lock::Timeout="$left" "$@" 2>&1 | tee "$out" >&2
    rc=${PIPESTATUS[0]}
    ((rc == 0)) && return 0
    grep -qE "Could not get lock|Unable to lock|Unable to acquire the dpkg frontend lock" "$out" \
      || return "$rc"
    if ((SECONDS >= deadline)); then
      echo "apt_install: the package lock was still held after ${timeout_s} s; giving up" >&2
      return "$rc"
    fi
    if ((!said)); then
      echo "apt_install: another apt/dpkg holds the package lock; waiting up to" \
           "$((deadline - SECONDS)) s more (BAZELW_APT_LOCK_TIMEOUT)" >&2
      said=1
    fi
    sleep "$retry_s"
  done
}

apt_get update -q || exit
apt_get install -y -q --no-install-recommends "$@"
