#!/usr/bin/env bash
# Checks the systemd units in systemd/:
# - `systemd-analyze verify` passes for the system units and the user units,
#   with no message at all (an unknown key is only a warning to systemd,
#   and a failure here);
# - `systemd-analyze security --offline=true` scores the system service no
#   higher than MAX_EXPOSURE (lower it when the unit gets stricter).
# The units name installed paths (/usr/bin/palisaded, ~/.local/bin, and
# /bin/kill for ExecReload), so they are verified inside a scratch root
# holding the built palisaded there, the host's kill, and the host's own
# units (the targets they refer to).
# Usage: scripts/check-units.sh [DIR with palisaded, default target/debug]
set -euo pipefail
cd "$(dirname "$0")/.."
MAX_EXPOSURE=4.4
bin_dir=${1:-target/debug}
[ -x "$bin_dir/palisaded" ] || { echo "no palisaded in $bin_dir: build it first" >&2; exit 1; }
command -v systemd-analyze >/dev/null || { echo "systemd-analyze is missing (Debian package systemd)" >&2; exit 1; }

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/bin" "$root/bin" "$root/usr/lib/systemd/system" "$root/usr/lib/systemd/user" \
  "$root/home/ci/.local/bin" "$root/runtime"
chmod 700 "$root/runtime"
cp -a /usr/lib/systemd/system/. "$root/usr/lib/systemd/system/"
cp "$bin_dir/palisaded" "$root/usr/bin/palisaded"
cp "$(readlink -f /bin/kill)" "$root/bin/kill"
cp "$bin_dir/palisaded" "$root/home/ci/.local/bin/palisaded"
cp systemd/palisade.service systemd/palisade.socket "$root/usr/lib/systemd/system/"
cp systemd/user/palisade.service systemd/user/palisade.socket "$root/usr/lib/systemd/user/"

verify_system() { (cd "$root" && systemd-analyze verify --root="$root" --man=no "$@" 2>&1); }
verify_user() {
  (cd "$root" && XDG_RUNTIME_DIR="$root/runtime" HOME="$root/home/ci" \
    systemd-analyze verify --user --man=no "${@/#/$root/usr/lib/systemd/user/}" 2>&1)
}
silent() {
  local out
  if ! out=$("$@") || [ -n "$out" ]; then
    echo "systemd-analyze verify: ${out:-failed}" >&2
    return 1
  fi
}

# The check itself must be able to fail: a misspelt key is reported.
cp systemd/palisade.service "$root/usr/lib/systemd/system/palisade-typo.service"
echo "ProtectSytem=strict" >> "$root/usr/lib/systemd/system/palisade-typo.service"
if silent verify_system palisade-typo.service 2>/dev/null; then
  echo "systemd-analyze verify said nothing of a misspelt key: it checks nothing here" >&2
  exit 1
fi

silent verify_system palisade.service palisade.socket
echo "systemd/palisade.service, palisade.socket: systemd-analyze verify passes"
silent verify_user palisade.service palisade.socket
echo "systemd/user/palisade.service, palisade.socket: systemd-analyze verify --user passes"

score=$(systemd-analyze security --offline=true --no-pager systemd/palisade.service 2>&1 |
  sed -n 's/.*Overall exposure level for palisade.service: \([0-9.]*\).*/\1/p')
[ -n "$score" ] || { echo "systemd-analyze security printed no exposure level" >&2; exit 1; }
echo "systemd/palisade.service: exposure $score (at most $MAX_EXPOSURE)"
if awk -v s="$score" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(s > m) }'; then
  echo "the system service's exposure rose from $MAX_EXPOSURE to $score" >&2
  exit 1
fi
