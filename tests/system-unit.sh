#!/bin/sh
# Runs a palisaded in a mount namespace shaped as the system unit shapes
# its own (systemd/palisade.service): the host read-only but for its
# ReadWritePaths (ProtectSystem=strict), a /tmp and /var/tmp of its own
# (PrivateTmp), a /dev of the basic nodes only (PrivateDevices), its runtime
# directory writable (RuntimeDirectory, SERVICE_USER's); and as the unit's
# user SERVICE_USER with its capabilities (ambient and the bounding set),
# umask and no_new_privs. A user's client, outside that
# namespace as a user's shell is, runs a command that writes in the
# workspace WS, which must come back to the user.
# Usage (as root):
#   system-unit.sh BIN_DIR PROBE WORK USER SERVICE_USER CAPS UMASK CONFIG WS [READ_WRITE_PATH...]
# BIN_DIR holds palisaded, palisade and palisade-helper; PROBE is the test
# probe, run in the sandbox. They are run from copies in WORK/bin, which
# CONFIG grants read-only; the socket is WORK/run/palisade.sock (the unit's
# is in its RuntimeDirectory). WORK must not lie under /tmp or /var/tmp,
# which the service does not share. READ_WRITE_PATH: the unit's
# ReadWritePaths (none: the host is all read-only to the service). The
# daemon's journal, state and temp_root (CONFIG names /tmp/runs) are in its
# private /tmp, as the unit's are in its own directories. The client runs
# with umask 022, as a user's shell does. Prints the daemon's log when the
# run fails.
set -eu

if [ "${1:-}" = service ]; then
  # The service's side, in its own mount namespace (unshare -m).
  work=$2 service_user=$3 caps=$4 um=$5 config=$6
  shift 6
  # PrivateDevices: the old /dev kept aside, a tmpfs with the basic nodes.
  mkdir -p "$work/olddev"
  mount --bind /dev "$work/olddev"
  mount -t tmpfs -o mode=0755,nosuid tmpfs /dev
  for n in null zero full random urandom tty; do
    touch "/dev/$n"
    mount --bind "$work/olddev/$n" "/dev/$n"
  done
  mkdir /dev/pts /dev/shm
  mount --bind "$work/olddev/pts" /dev/pts
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm
  umount -l "$work/olddev"
  # ProtectSystem=strict: every mount read-only but the API filesystems.
  awk '{ print $5 }' /proc/self/mountinfo | sort -u | while read -r mp; do
    case $mp in /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;; esac
    mount -o remount,bind,ro "$mp" 2>/dev/null || true
  done
  # ReadWritePaths, and the runtime directory.
  for rw in "$@" "$work/run"; do
    [ -d "$rw" ] || continue
    mount --bind "$rw" "$rw"
    mount -o remount,bind,rw "$rw"
  done
  # PrivateTmp: /tmp and /var/tmp both.
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /var/tmp
  if touch /usr/.palisade-unit-check 2>/dev/null; then
    echo "the host is still writable: the namespace is not what the unit makes" >&2
    exit 1
  fi
  umask "$um"
  PALISADE_JOURNAL=/tmp/journal PALISADE_STATE=/tmp/state
  export PALISADE_JOURNAL PALISADE_STATE
  exec setpriv --reuid "$(id -u "$service_user")" --regid "$(id -g "$service_user")" --clear-groups \
    --no-new-privs --inh-caps "-all,$caps" --ambient-caps "-all,$caps" --bounding-set "-all,$caps" -- \
    "$work/bin/palisaded" --config "$config" --socket "$work/run/palisade.sock"
fi

bin=$1 probe=$2 work=$3 user=$4 service_user=$5 caps=$6 um=$7 config=$8 ws=$9
shift 9

# The binaries, copied where the service's private /tmp cannot hide them
# (a checkout may live under /tmp); the broker finds the helper beside itself.
mkdir -p "$work/bin" "$work/run"
chmod 0755 "$work/run"
chown "$service_user:" "$work/run"
cp "$bin/palisaded" "$bin/palisade" "$bin/palisade-helper" "$probe" "$work/bin/"
bin=$work/bin
probe=$work/bin/$(basename "$probe")

unshare -m --propagation private sh "$0" service "$work" "$service_user" "$caps" "$um" "$config" "$@" \
  2> "$work/palisaded.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
i=0
until [ -S "$work/run/palisade.sock" ]; do
  i=$((i + 1))
  [ $i -lt 200 ] || { cat "$work/palisaded.log" >&2; exit 1; }
  sleep 0.1
done
uid=$(id -u "$user")
gid=$(id -g "$user")
cd "$ws"
umask 022
if ! setpriv --reuid "$uid" --regid "$gid" --clear-groups -- \
  "$bin/palisade" run --socket "$work/run/palisade.sock" --workspace "$ws" -- "$probe" write "$ws/out"; then
  cat "$work/palisaded.log" >&2
  exit 1
fi
