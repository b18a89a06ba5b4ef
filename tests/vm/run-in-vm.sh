#!/usr/bin/env bash
# run-in-vm.sh - run a test binary inside a throwaway QEMU guest (Debian kernel,
# busybox initramfs, pure cgroup v2 with memory/pids/cpu, user namespaces, Landlock).
#
# Usage: run-in-vm.sh [options] BINARY [ARGS...]
#        run-in-vm.sh [options] DIR PROG [ARGS...]     (PROG relative to DIR, or absolute in guest)
#
# Options:
#   --mem SIZE        guest memory (default 2G)
#   --timeout SECS    wall-clock limit for the whole VM run (default 120); exit 124 when hit
#   --smp N           guest CPUs (default 1)
#   --as WHO          root | user | both (default both: root first, then uid --uid)
#   --uid N[:G]       unprivileged uid[:gid] (default 1000:1000)
#   --cgmode MODE     leaf (default): process starts in $VMTEST_CGROUP/init, and
#                       $VMTEST_CGROUP has the controllers enabled in subtree_control;
#                     inplace: process starts in $VMTEST_CGROUP itself, nothing enabled
#                       there (like a systemd Delegate=yes scope)
#   --controllers "L" controllers enabled below the root (default "memory pids cpu")
#   --keep-v1         do not disable the cgroup v1 controllers (cgroup_no_v1=all): with
#                       --controllers "" the program may mount v1 hierarchies itself
#   --env K=V         export K=V to the program (repeatable)
#   --add SRC[:DEST]  also copy SRC (file or dir) into the guest at DEST (default /vmtest/<name>)
#   --accel A         auto | kvm | tcg (default auto: kvm only if usable, else tcg)
#   --cpu MODEL       QEMU -cpu model (default: host with kvm, max with tcg)
#   --kernel PATH     kernel (default: the package linux-image-amd64 of this machine's
#                       Debian release, fetched into the cache; env VM_KERNEL; "boot":
#                       the newest /boot/vmlinuz-*)
#   --append STR      extra kernel command line
#   --kmsg            show kernel messages on the console (default: loglevel=1)
#   --dmesg           print the guest's dmesg after the runs
#   -h, --help
#
# The program's output (and the guest console) goes to stdout. Exit status: the
# program's status (if --as both: root's if non-zero, else the user's); 124 on
# timeout; 125 if the guest died without a result; 2 on usage/setup errors.
# In the guest: stdin /dev/null, cwd /vmtest, HOME=/home/<root|user>, TMPDIR=/tmp/<root|user>,
# VMTEST_CGROUP=<delegated cgroup dir>, VMTEST_AS=root|user, VMTEST_UID.
# Dynamically linked ELF files (glibc) get their ldd libraries + loader copied in.
# Cache: ${VMCACHE:-/var/tmp/vmcache} (extracted vmlinux, base initramfs, and Debian's
# linux-image .deb, fetched with apt-get download and unpacked there: the same kernel
# whatever this machine itself boots).
# Needs: qemu-system-x86, linux-image-amd64, busybox-static, gcc (static libc),
# cpio, xz-utils, binutils. No network is configured in the guest (-nodefaults).
set -euo pipefail

SCRIPT_VERSION=6
MEM=2G TIMEOUT=120 SMP=1 AS=both RUID=1000 RGID=1000 CGMODE=leaf
CONTROLLERS="memory pids cpu" NOV1="cgroup_no_v1=all" ACCEL=auto KERNEL=${VM_KERNEL:-} APPEND="" KMSG=0 DMESG=0
CACHE=${VMCACHE:-/var/tmp/vmcache} CPU=""
ENVS=() ADDS=()

die() { echo "run-in-vm: $*" >&2; exit 2; }
log() { echo "run-in-vm: $*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit "${1:-0}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --mem) MEM=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --smp) SMP=$2; shift 2 ;;
    --as) AS=$2; shift 2 ;;
    --uid) RUID=${2%%:*}; RGID=${2#*:}; [ "$RGID" = "$2" ] && RGID=$RUID; shift 2 ;;
    --cgmode) CGMODE=$2; shift 2 ;;
    --controllers) CONTROLLERS=$2; shift 2 ;;
    --keep-v1) NOV1=""; shift ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --add) ADDS+=("$2"); shift 2 ;;
    --accel) ACCEL=$2; shift 2 ;;
    --cpu) CPU=$2; shift 2 ;;
    --kernel) KERNEL=$2; shift 2 ;;
    --append) APPEND=$2; shift 2 ;;
    --kmsg) KMSG=1; shift ;;
    --dmesg) DMESG=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || usage 2
case "$AS" in root|user|both) ;; *) die "--as must be root, user or both" ;; esac
case "$CGMODE" in leaf|inplace) ;; *) die "--cgmode must be leaf or inplace" ;; esac
TARGET=$1; shift
[ -e "$TARGET" ] || die "$TARGET: not found"

QEMU=$(command -v qemu-system-x86_64) || die "qemu-system-x86_64 missing: apt-get install -y qemu-system-x86"
for t in cpio readelf gcc sha256sum; do command -v $t >/dev/null || die "$t missing"; done
BUSYBOX=""
for b in /bin/busybox /usr/bin/busybox; do
  if [ -x "$b" ] && ! readelf -l "$b" 2>/dev/null | grep 'program interpreter' >/dev/null; then BUSYBOX=$b; break; fi
done
[ -n "$BUSYBOX" ] || die "no static busybox: apt-get install -y busybox-static"
T0=$(date +%s.%N)
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9   # serialise cache builds; released after the cache step below

if [ "$KERNEL" = boot ]; then
  KERNEL=$(ls -1v /boot/vmlinuz-* 2>/dev/null | tail -n1 || true)
  [ -n "$KERNEL" ] || die "--kernel boot: no /boot/vmlinuz-*"
fi
if [ -z "$KERNEL" ]; then
  KERNEL=$(ls -1v "$CACHE"/kernel/boot/vmlinuz-* 2>/dev/null | tail -n1 || true)
fi
if [ -z "$KERNEL" ]; then
  # no installed kernel: fetch Debian's linux-image .deb (apt lists must be current) and unpack
  # only its /boot into the cache - no postinst, no host initramfs
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
  [ -n "$pkg" ] || die "no kernel: apt-get install -y linux-image-amd64 (or apt-get update first)"
  log "downloading $pkg into $CACHE/kernel"
  kd=$(mktemp -d "$CACHE/kdl.XXXXXX")
  (cd "$kd" && apt-get download "$pkg" >/dev/null 2>&1) || die "apt-get download $pkg failed"
  mkdir -p "$CACHE/kernel"
  dpkg-deb --fsys-tarfile "$kd"/*.deb | tar -x -C "$CACHE/kernel" ./boot
  rm -rf "$kd"
  KERNEL=$(ls -1v "$CACHE"/kernel/boot/vmlinuz-* | tail -n1)
fi
[ -r "$KERNEL" ] || die "cannot read kernel $KERNEL"

CACHE_STATE=hit

# ---------------------------------------------------------------- kernel
# TCG boots an uncompressed vmlinux via the PVH entry point (no decompression
# under emulation: ~2x faster than the bzImage). Extract it once.
KKEY=$(stat -c '%n %s %Y' "$KERNEL" | sha256sum | cut -c1-16)
VMLINUX="$CACHE/vmlinux-$(basename "$KERNEL" | sed 's/^vmlinuz-//')-$KKEY"
if [ ! -s "$VMLINUX" ] && [ ! -e "$VMLINUX.nopvh" ]; then
  CACHE_STATE=miss
  tmpk="$VMLINUX.tmp.$$"
  ok=0
  for spec in 'xz:\xfd7zXZ\x00:xz -dc --single-stream' 'zstd:\x28\xb5\x2f\xfd:zstd -dcq' 'gzip:\x1f\x8b\x08:gzip -dcq'; do
    IFS=: read -r name magic cmd <<<"$spec"
    command -v "$name" >/dev/null || continue
    for off in $(LC_ALL=C grep -obUaP "$magic" "$KERNEL" 2>/dev/null | cut -d: -f1 | head -n3); do
      if tail -c +$((off + 1)) "$KERNEL" | $cmd > "$tmpk" 2>/dev/null || [ -s "$tmpk" ]; then
        if readelf -n "$tmpk" 2>/dev/null | grep 'note type: (0x00000012)' >/dev/null; then ok=1; break 2; fi
      fi
    done
  done
  if [ $ok = 1 ]; then mv "$tmpk" "$VMLINUX"; else rm -f "$tmpk"; touch "$VMLINUX.nopvh"; log "no PVH vmlinux extractable; booting bzImage (slower under TCG)"; fi
fi
BOOTK=$KERNEL; [ -s "$VMLINUX" ] && BOOTK=$VMLINUX

# --------------------------------------------------------- base initramfs
read -r -d '' INIT_SH <<'EOF_INIT' || true
#!/bin/busybox sh
# vmtest init (PID 1)
export PATH=/bin:/sbin
# The initramfs root cannot be pivoted away from (pivot_root fails on rootfs),
# and sandboxes pivot: move everything to a tmpfs and switch_root into it.
if [ "$1" != stage2 ]; then
  /bin/busybox mkdir -p /newroot
  /bin/busybox mount -t tmpfs -o mode=755 tmpfs /newroot
  for d in /*; do
    case "$d" in /newroot|/proc|/sys|/dev) ;; *) /bin/busybox cp -a "$d" /newroot/ ;; esac
  done
  /bin/busybox mkdir -p /newroot/proc /newroot/sys /newroot/dev
  exec /bin/busybox switch_root /newroot /init stage2
fi
/bin/busybox mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
mount -t cgroup2 -o nsdelegate,memory_recursiveprot cgroup2 /sys/fs/cgroup
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts 2>/dev/null
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
ip link set lo up 2>/dev/null
hostname vmtest
. /vmtest-run/config
say() { echo "vmtest: $*"; }
say "kernel $(uname -r); lsm=$(cat /sys/kernel/security/lsm 2>/dev/null); nproc=$(nproc); mem=$(awk '/MemTotal/{print $2" kB"}' /proc/meminfo)"
for c in $VMTEST_CONTROLLERS; do
  echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || say "warning: cannot enable controller $c"
done
say "cgroup2 root: controllers=[$(cat /sys/fs/cgroup/cgroup.controllers)] subtree_control=[$(cat /sys/fs/cgroup/cgroup.subtree_control)]"

run_one() { # label uid gid
  label=$1 uid=$2 gid=$3
  CG=/sys/fs/cgroup/vmtest-$label
  mkdir -p "$CG"
  target=$CG
  if [ "$VMTEST_CGMODE" = leaf ]; then
    mkdir -p "$CG/init"
    for c in $(cat /sys/fs/cgroup/cgroup.subtree_control); do echo "+$c" > "$CG/cgroup.subtree_control"; done
    target=$CG/init
  fi
  home=/home/$label tmp=/tmp/$label
  mkdir -p "$home" "$tmp"
  if [ "$uid" != 0 ]; then
    # cgroup v2 delegation: the directory + procs/threads/subtree_control, not the limits
    chown "$uid:$gid" "$CG" "$CG/cgroup.procs" "$CG/cgroup.threads" "$CG/cgroup.subtree_control" "$home" "$tmp"
    [ "$target" != "$CG" ] && chown -R "$uid:$gid" "$target"
  fi
  say "===== run as $label (uid $uid) in cgroup ${target#/sys/fs/cgroup} (delegated: ${CG#/sys/fs/cgroup}) ====="
  (
    echo 0 > "$target/cgroup.procs"
    cd /vmtest 2>/dev/null || cd /
    export HOME=$home TMPDIR=$tmp USER=$label LOGNAME=$label VMTEST_CGROUP=$CG VMTEST_AS=$label VMTEST_UID=$uid
    vmtest_env
    eval "set -- $VMTEST_ARGV"
    if [ "$uid" = 0 ]; then exec "$VMTEST_PROG" "$@" </dev/null; else exec /bin/vmrunas "$uid" "$gid" "$VMTEST_PROG" "$@" </dev/null; fi
  )
  rc=$?
  say "===== $label exit status $rc ====="
}

rc_root=- rc_user=-
if [ "$VMTEST_AS" != user ]; then run_one root 0 0; rc_root=$rc; fi
if [ "$VMTEST_AS" != root ]; then run_one user "$VMTEST_UID" "$VMTEST_GID"; rc_user=$rc; fi
if [ "$VMTEST_DMESG" = 1 ]; then say "----- dmesg -----"; dmesg; fi
echo "@@VMTEST-RESULT root=$rc_root user=$rc_user@@"
sync
poweroff -f
EOF_INIT

read -r -d '' RUNAS_C <<'EOF_C' || true
/* vmrunas UID GID PROG ARGS... : drop to uid/gid (no supplementary groups) and exec */
#define _GNU_SOURCE
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: vmrunas UID GID PROG ARGS...\n"); return 2; }
    uid_t u = (uid_t)atol(argv[1]); gid_t g = (gid_t)atol(argv[2]);
    if (setgroups(0, NULL) || setresgid(g, g, g) || setresuid(u, u, u)) { perror("vmrunas"); return 126; }
    execv(argv[3], argv + 3);
    perror(argv[3]);
    return 127;
}
EOF_C

BBSUM=$(sha256sum "$BUSYBOX" | cut -c1-64)
BKEY=$(printf '%s\n%s\n%s\n%s\n' "$SCRIPT_VERSION" "$BBSUM" "$INIT_SH" "$RUNAS_C" | sha256sum | cut -c1-16)
BASE="$CACHE/base-$BKEY.cpio"
if [ ! -s "$BASE" ]; then
  CACHE_STATE=miss
  st=$(mktemp -d "$CACHE/base.XXXXXX")
  mkdir -p "$st"/{bin,dev,proc,sys,tmp,run,etc,root,home,vmtest,lib,lib64}
  ln -s bin "$st/sbin"; mkdir -p "$st/usr"; ln -s ../bin "$st/usr/bin"; ln -s ../bin "$st/usr/sbin"
  cp "$BUSYBOX" "$st/bin/busybox"
  for a in $("$BUSYBOX" --list); do [ "$a" = busybox ] || ln -sf busybox "$st/bin/$a"; done
  printf '%s\n' "$INIT_SH" > "$st/init"; chmod 755 "$st/init"
  printf '%s\n' "$RUNAS_C" > "$st/vmrunas.c"
  gcc -static -O2 -o "$st/bin/vmrunas" "$st/vmrunas.c" || die "gcc -static failed (need libc6-dev)"
  rm "$st/vmrunas.c"
  chmod 1777 "$st/tmp"; chmod 755 "$st"
  (cd "$st" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) > "$BASE.tmp.$$"
  mv "$BASE.tmp.$$" "$BASE"
  rm -rf "$st"
fi
flock -u 9

# ---------------------------------------------------------------- payload
WORK=$(mktemp -d "${TMPDIR:-/tmp}/run-in-vm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
P="$WORK/payload"
mkdir -p "$P/vmtest" "$P/vmtest-run" "$P/etc"
printf 'root:x:0:0:root:/home/root:/bin/sh\nuser:x:%s:%s:user:/home/user:/bin/sh\n' "$RUID" "$RGID" > "$P/etc/passwd"
printf 'root:x:0:\nuser:x:%s:\n' "$RGID" > "$P/etc/group"
if [ -d "$TARGET" ]; then
  [ $# -ge 1 ] || die "directory mode needs PROG (path inside $TARGET)"
  cp -a "$TARGET/." "$P/vmtest/"
  PROG=$1; shift
  case "$PROG" in /*) ;; *) PROG="/vmtest/${PROG#./}" ;; esac
else
  cp -L "$TARGET" "$P/vmtest/"
  PROG="/vmtest/$(basename "$TARGET")"
fi
for a in ${ADDS[@]+"${ADDS[@]}"}; do
  src=${a%%:*} dst=${a#*:}; [ "$dst" = "$a" ] && dst="/vmtest/$(basename "$src")"
  mkdir -p "$P$(dirname "$dst")"; cp -aL "$src" "$P$dst"
done

# glibc-dynamic ELF files: copy the libraries ldd reports (+ the loader) to the same paths
declare -A LIBS=()
while IFS= read -r -d '' f; do
  readelf -h "$f" >/dev/null 2>&1 || continue
  readelf -d "$f" 2>/dev/null | grep '(NEEDED)' >/dev/null || continue
  out=$(ldd "$f" 2>&1) || { log "warning: ldd $f failed: $out"; continue; }
  if grep -q 'not found' <<<"$out"; then die "$f: missing libraries: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"; fi
  while read -r l; do [ -n "$l" ] && LIBS["$l"]=1; done < <(awk '$2=="=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$out")
done < <(find "$P" -type f -print0)
for l in "${!LIBS[@]}"; do
  mkdir -p "$P$(dirname "$l")"; [ -e "$P$l" ] || cp -L "$l" "$P$l"
done
[ ${#LIBS[@]} -gt 0 ] && log "copied ${#LIBS[@]} shared libraries: $(printf '%s ' "${!LIBS[@]}")"

sq() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }
{
  echo "VMTEST_AS=$AS VMTEST_UID=$RUID VMTEST_GID=$RGID VMTEST_CGMODE=$CGMODE VMTEST_DMESG=$DMESG"
  echo "VMTEST_CONTROLLERS=$(sq "$CONTROLLERS")"
  echo "VMTEST_PROG=$(sq "$PROG")"
  printf 'VMTEST_ARGV='; argv=""; for a in "$@"; do argv="$argv $(sq "$a")"; done; sq "$argv"; echo
  echo 'vmtest_env() {'
  echo '  :'
  for e in ${ENVS[@]+"${ENVS[@]}"}; do echo "  export ${e%%=*}=$(sq "${e#*=}")"; done
  echo '}'
} > "$P/vmtest-run/config"
INITRD="$WORK/initrd.cpio"
cp "$BASE" "$INITRD"
(cd "$P" && find . -mindepth 1 -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) >> "$INITRD"

# ------------------------------------------------------------------- qemu
kvm_usable() {
  [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
  grep -qwE 'vmx|svm' /proc/cpuinfo || return 1       # PVM hosts (kvm_pvm) only run PVM guest kernels
  [ ! -d /sys/module/kvm_pvm ] || return 1
}
case "$ACCEL" in
  auto) if kvm_usable; then ACCEL=kvm; else ACCEL=tcg; fi ;;
  kvm|tcg) ;;
  *) die "--accel must be auto, kvm or tcg" ;;
esac
if [ "$ACCEL" = kvm ]; then ACCELARGS=(-accel kvm -cpu "${CPU:-host}"); else ACCELARGS=(-accel tcg -cpu "${CPU:-max}"); fi
BIOS=(); [ -r /usr/share/qemu/qboot.rom ] && BIOS=(-bios /usr/share/qemu/qboot.rom)
LOGLEVEL=1; [ "$KMSG" = 1 ] && LOGLEVEL=7
CMDLINE="console=ttyS0 panic=-1 loglevel=$LOGLEVEL rdinit=/init $NOV1 8250.nr_uarts=1 no_timer_check random.trust_cpu=on $APPEND"

T1=$(date +%s.%N)
LOG="$WORK/console.log"
set +e
timeout -k 5 "$TIMEOUT" "$QEMU" -nodefaults -no-user-config -M pc "${ACCELARGS[@]}" "${BIOS[@]}" \
  -m "$MEM" -smp "$SMP" -display none -serial stdio -no-reboot \
  -kernel "$BOOTK" -initrd "$INITRD" -append "$CMDLINE" </dev/null 2>&1 \
  | sed -u 's/\r$//; s/\x1b\[[0-9;?]*[A-Za-z]//g; /^\[ *[0-9.]*\] reboot: Power down$/d' | tee "$LOG"
QRC=${PIPESTATUS[0]}
set -e
T2=$(date +%s.%N)

res=$(grep -ao '@@VMTEST-RESULT root=[-0-9]* user=[-0-9]*@@' "$LOG" | tail -n1 || true)
log "accel=$ACCEL kernel=$(basename "$BOOTK") cache=$CACHE_STATE prepare=$(awk "BEGIN{printf \"%.2f\", $T1-$T0}")s vm=$(awk "BEGIN{printf \"%.2f\", $T2-$T1}")s"
if [ -z "$res" ]; then
  if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then log "timeout after ${TIMEOUT}s"; exit 124; fi
  log "guest ended without a result (qemu exit $QRC)"; exit 125
fi
r_root=$(sed 's/.*root=\([-0-9]*\).*/\1/' <<<"$res"); r_user=$(sed 's/.*user=\([-0-9]*\)@@/\1/' <<<"$res")
if [ "$r_root" != - ] && [ "$r_root" != 0 ]; then exit "$r_root"; fi
if [ "$r_user" != - ]; then exit "$r_user"; fi
exit "$r_root"
