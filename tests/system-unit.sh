#!/bin/sh
# Runs a root palisaded in a mount namespace shaped as the system unit shapes
# its own (systemd/palisade.service): the host read-only but for its
# ReadWritePaths (ProtectSystem=strict), a private /tmp (PrivateTmp) and a
# /dev of the basic nodes only (PrivateDevices); and under the unit's
# capability bounding set, umask and no_new_privs. A user's run writes in its
# workspace there, which must come back to the user.
# Usage (as root, in a private mount namespace: unshare -m --propagation private):
#   system-unit.sh BIN_DIR PROBE WORK USER CAPS UMASK CONFIG [READ_WRITE_PATH]
# BIN_DIR holds palisaded, palisade and palisade-helper; PROBE is the test
# probe, run in the sandbox. They are run from copies in WORK/bin, which
# CONFIG grants read-only.
# WORK lies under /var/tmp, one of the unit's ReadWritePaths; without
# READ_WRITE_PATH (/var/tmp), it is as read-only as the rest of the host.
# The daemon's socket, journal and temp_root (CONFIG names /tmp/runs) are in
# its private /tmp, as the unit's are in its own directories. Prints the
# daemon's log when the run fails.
set -eu
bin=$1 probe=$2 work=$3 user=$4 caps=$5 um=$6 config=$7 rw=${8:-}

# The binaries, copied where the private /tmp below cannot hide them (a
# checkout may live under /tmp); the broker finds the helper beside itself.
mkdir -p "$work/bin"
cp "$bin/palisaded" "$bin/palisade" "$bin/palisade-helper" "$probe" "$work/bin/"
bin=$work/bin
probe=$work/bin/$(basename "$probe")

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
# ReadWritePaths=/var/tmp (the others of the unit are not needed here).
if [ -n "$rw" ]; then
  mount --bind "$rw" "$rw"
  mount -o remount,bind,rw "$rw"
fi
# PrivateTmp.
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs /tmp
if touch /usr/.palisade-unit-check 2>/dev/null; then
  echo "the host is still writable: the namespace is not what the unit makes" >&2
  exit 1
fi

umask "$um"
PALISADE_JOURNAL=/tmp/journal PALISADE_STATE=/tmp/state setpriv --no-new-privs --bounding-set "-all,$caps" -- \
  "$bin/palisaded" --config "$config" --socket /tmp/palisade.sock 2> "/tmp/palisaded.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
i=0
until [ -S /tmp/palisade.sock ]; do
  i=$((i + 1))
  [ $i -lt 200 ] || { cat "/tmp/palisaded.log" >&2; exit 1; }
  sleep 0.1
done
uid=$(id -u "$user")
gid=$(id -g "$user")
cd "$work/ws"
if ! setpriv --reuid "$uid" --regid "$gid" --clear-groups -- \
  "$bin/palisade" run --socket /tmp/palisade.sock --workspace "$work/ws" -- "$probe" write "$work/ws/out"; then
  cat "/tmp/palisaded.log" >&2
  exit 1
fi
