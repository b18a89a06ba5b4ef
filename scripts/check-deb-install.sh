#!/usr/bin/env bash
# Installs, removes and purges a palisade package with dpkg in a scratch root,
# checking what each step leaves against what README.md ("A Debian package")
# and scripts/build-deb.sh say. scripts/check-deb.sh runs it.
#
# The scratch root is an overlay of this host's root filesystem with an upper
# layer on a tmpfs, mounted in this process's mount namespace, which must be
# private (unshare -m --propagation private): dpkg, the maintainer scripts
# (systemd-sysusers, systemd-tmpfiles) and the checks change only the
# overlay, which goes with the namespace. No systemd runs there, so the
# maintainer scripts' systemctl steps are skipped, as on any host without it;
# what they do instead is checked: a palisaded started by hand in the scratch
# root is stopped by the removal (start-stop-daemon matches its program, the
# scratch root's /usr/bin/palisaded, which no process outside runs), and the
# purge unmounts what was left mounted under /run/palisade (the scratch
# root's /proc/self/mountinfo lists only the mounts under that root).
#
# Usage (as root, in a private mount namespace):
#   check-deb-install.sh DEB [SOURCE_ONLY...]
# SOURCE_ONLY: relative links of the installed documentation, as paths under
# /usr/share/doc/palisade, that name source files the package does not install.
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: check-deb-install.sh DEB [SOURCE_ONLY...]" >&2; exit 2; }
deb=$(realpath -- "$1")
shift
source_only=("$@")
repo=$(realpath -- "$(dirname "$0")/..")
[ "$(id -u)" = 0 ] || { echo "check-deb-install: run it as root" >&2; exit 1; }
if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/1/ns/mnt)" ]; then
    echo "check-deb-install: not in a mount namespace of its own (unshare -m --propagation private)" >&2
    exit 1
fi
for tool in chroot mount dpkg man getent awk; do
    command -v "$tool" >/dev/null || { echo "check-deb-install: $tool is missing" >&2; exit 1; }
done

# What the overlay's upper layer may take: the package unpacked, dpkg's
# database copied up, and mandb's index.
SCRATCH_SIZE=4g
DOC=/usr/share/doc/palisade

scratch=$(mktemp -d /tmp/palisade-deb.XXXXXX)
cleanup() {
    umount -R -l "$scratch" 2>/dev/null || true
    rmdir "$scratch" 2>/dev/null || true
}
trap cleanup EXIT
# The upper layer on a file system of its own: an upper directory inside the
# lower layer (the host's root) would overlap it.
mount -t tmpfs -o "mode=0700,size=$SCRATCH_SIZE" tmpfs "$scratch"
mkdir "$scratch/upper" "$scratch/work" "$scratch/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$scratch/upper,workdir=$scratch/work" "$scratch/root"
r=$scratch/root
mount --rbind /dev "$r/dev"
mount -t proc proc "$r/proc"
mount -t tmpfs -o mode=0755 tmpfs "$r/run"
mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
# Whatever the host has of palisade is not what is checked here.
for host_copy in /etc/palisade /var/lib/palisade /usr/share/doc/palisade; do
    [ ! -e "$r$host_copy" ] || rm -rf --one-file-system "${r:?}$host_copy"
done
cp "$deb" "$r/tmp/palisade.deb"

# A command in the scratch root, with a plain environment.
in_root() { chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 "$@"; }

failures=0
check() {
    local what=$1
    shift
    if "$@"; then
        echo "  ok: $what"
    else
        echo "  FAILED: $what" >&2
        failures=$((failures + 1))
    fi
}
absent() { [ ! -e "$r$1" ] && [ ! -L "$r$1" ]; }
not() { ! "$@"; }
# Whether process $1 runs (a zombie, not yet waited for, does not).
alive() {
    local state
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
    [ -n "$state" ] && [ "$state" != Z ]
}
gone() { ! alive "$1"; }
# Whether anything is mounted at or under $1 of the scratch root, in this
# mount namespace (mountinfo's fifth field).
mounted_under() {
    awk -v top="$r$1" '$5 == top || index($5, top "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo
}
status() { in_root dpkg-query -W -f='${db:Status-Status}' palisade 2>/dev/null || echo not-installed; }
status_is() { [ "$(status)" = "$1" ]; }
has_group() { in_root getent group palisade >/dev/null; }
# The broker's user, in the group palisade, with no login.
has_user() { [ "$(in_root getent passwd palisade | cut -d: -f4,7)" = "$(in_root getent group palisade | cut -d: -f3):/usr/sbin/nologin" ]; }
mode_is() { [ "$(in_root stat -c '%F %a %U:%G' "$1")" = "$2" ]; }
man_finds() { [ "$(in_root man -w "$@" 2>/dev/null)" = "/usr/share/man/man$1/$2.$1.gz" ]; }
# Every installed page renders, and groff has nothing to say about it.
pages_render() {
    local page warnings ok=0
    for page in "$r"/usr/share/man/man[18]/palisade*; do
        warnings=$(in_root env MANWIDTH=80 man --warnings -E UTF-8 -l "${page#"$r"}" 2>&1 >/dev/null) || warnings+=" (failed)"
        [ -z "$warnings" ] || { echo "    ${page#"$r"}: $warnings" >&2; ok=1; }
    done
    return $ok
}

# The relative links of the installed Markdown files that lead nowhere, as
# paths, one a line; those in SOURCE_ONLY are printed to fd 3.
dead_links() {
    local file dir target path
    while IFS= read -r -d '' file; do
        dir=$(dirname "${file#"$r"}")
        grep -o '](\([^)]*\))' "$file" | sed 's/^](//; s/)$//; s/#.*//' | while IFS= read -r target; do
            case $target in '' | *://* | mailto:* | /*) continue ;; esac
            path=$(realpath -m -s -- "$dir/$target")
            [[ $target == */ ]] && path+=/
            if printf '%s\n' "${source_only[@]/#/$DOC/}" | grep -xF -- "$path" >/dev/null; then
                echo "$path" >&3
            elif ! in_root test -e "$path"; then
                echo "$path (${file#"$r"})"
            fi
        done
    done < <(find "$r$DOC" -name '*.md' -print0)
}
links_resolve() {
    local dead
    dead=$(dead_links 3>"$scratch/source-only")
    [ -z "$dead" ] || { echo "$dead" | sed 's/^/    dead link: /' >&2; return 1; }
}
# Every SOURCE_ONLY entry is still linked to: the list stays exact.
source_only_used() {
    local entry ok=0
    for entry in "${source_only[@]}"; do
        grep -qxF -- "$DOC/$entry" "$scratch/source-only" ||
            { echo "    SOURCE_ONLY names $entry, which no installed document links to" >&2; ok=1; }
    done
    return $ok
}
# The link check can fail: a document linking to nothing is found out.
link_check_fails() {
    echo "[gone](no-such-document.md)" >"$r$DOC/link-check.md"
    local dead
    dead=$(dead_links 3>/dev/null)
    rm "$r$DOC/link-check.md"
    grep -qF "$DOC/no-such-document.md" <<<"$dead"
}

echo "dpkg -i"
in_root dpkg -i /tmp/palisade.deb >"$scratch/dpkg.log" 2>&1 || { cat "$scratch/dpkg.log" >&2; exit 1; }
check "installed" status_is installed
check "the group palisade exists" has_group
check "the user palisade exists, in the group palisade, with no login" has_user
check "/var/lib/palisade is the broker's, 0700" mode_is /var/lib/palisade "directory 700 palisade:palisade"
check "/etc/palisade/palisade.toml is deploy/debian/palisade.toml" \
    cmp -s "$r/etc/palisade/palisade.toml" "$repo/deploy/debian/palisade.toml"
check "the annotated example is in $DOC/examples" \
    cmp -s "$r$DOC/examples/palisade.example.toml" "$repo/palisade.example.toml"
check "man finds palisade(1)" man_finds 1 palisade
check "man finds palisade-run(1)" man_finds 1 palisade-run
check "man finds palisaded(8)" man_finds 8 palisaded
check "the manual pages render without a warning" pages_render
check "the link check finds a dead link" link_check_fails
check "the installed documentation's relative links resolve" links_resolve
check "each SOURCE_ONLY link is still made" source_only_used

# What an administrator and the broker leave: a changed configuration, a
# journal, the runtime directory.
echo "# changed by the administrator" >>"$r/etc/palisade/palisade.toml"
mkdir -p "$r/var/lib/palisade/journal"
echo '{"seq":0}' >"$r/var/lib/palisade/journal/segment-00000000000000000000.jsonl"

# A broker started by hand, as on a host without systemd (none runs here):
# the removal stops it. Its own socket and state, under the scratch root's /tmp.
chroot "$r" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8 PALISADE_STATE=/tmp/by-hand \
    /usr/bin/palisaded --socket /tmp/by-hand.sock >"$scratch/by-hand.log" 2>&1 &
by_hand=$!
for _ in $(seq 100); do
    [ ! -S "$r/tmp/by-hand.sock" ] && alive "$by_hand" || break
    sleep 0.1
done
check "a broker started by hand serves" test -S "$r/tmp/by-hand.sock"
alive "$by_hand" || sed 's/^/    palisaded: /' "$scratch/by-hand.log" >&2

echo "dpkg --remove"
in_root dpkg --remove palisade >"$scratch/dpkg.log" 2>&1 || { cat "$scratch/dpkg.log" >&2; exit 1; }
check "the broker started by hand is stopped" gone "$by_hand"
kill -KILL "$by_hand" 2>/dev/null || true
wait "$by_hand" 2>/dev/null || true
mkdir -p "$r/run/palisade/runs"
check "only its configuration is left (config-files)" status_is config-files
check "the programs are gone" absent /usr/bin/palisaded
check "the manual pages are gone" absent /usr/share/man/man8/palisaded.8.gz
check "the documentation is gone" absent "$DOC"
check "the changed configuration is kept" grep -qx "# changed by the administrator" "$r/etc/palisade/palisade.toml"
check "the journal is kept" test -s "$r/var/lib/palisade/journal/segment-00000000000000000000.jsonl"
check "the group is kept" has_group
check "the user is kept" has_user

# What a broker that died can leave mounted under /run/palisade: a bind
# mount with another mount inside it, and a mount over the directory itself
# (hiding those beneath it until it is gone), with one more inside that.
mkdir -p "$scratch/held/inner" "$r/run/palisade/runs/held"
echo kept >"$scratch/held/inner/file"
mount --bind "$scratch/held" "$r/run/palisade/runs/held"
mount -t tmpfs tmpfs "$r/run/palisade/runs/held/inner"
mount --bind "$scratch/held" "$r/run/palisade"
mount -t tmpfs tmpfs "$r/run/palisade/inner"
check "something is mounted under /run/palisade" mounted_under /run/palisade

echo "dpkg --purge"
in_root dpkg --purge palisade >"$scratch/dpkg.log" 2>&1 || { cat "$scratch/dpkg.log" >&2; exit 1; }
check "nothing is mounted under /run/palisade any more" not mounted_under /run/palisade
check "what was mounted there is unmounted, not emptied" grep -qx kept "$scratch/held/inner/file"
check "purge says what it keeps" grep -q "/var/lib/palisade is kept" "$scratch/dpkg.log"
check "dpkg knows it no more" status_is not-installed
check "the configuration is gone" absent /etc/palisade
check "the runtime directory is gone" absent /run/palisade
check "the journal is kept" test -s "$r/var/lib/palisade/journal/segment-00000000000000000000.jsonl"
check "the group is kept" has_group
check "the user is kept" has_user

[ "$failures" = 0 ] || { echo "check-deb-install: $failures check(s) failed" >&2; exit 1; }
echo "check-deb-install: installed, removed and purged as documented"
