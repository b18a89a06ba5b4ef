#!/usr/bin/env bash
# Checks the Debian package scripts/build-deb.sh built:
# - every path it should install is there (`dpkg-deb -c`), owned by
#   root/root, with its mode;
# - the maintainer scripts are there and executable, and DEBIAN/conffiles
#   lists /etc/palisade/palisade.toml and /etc/apparmor.d/palisade-helper;
# - `lintian --fail-on error` passes (warnings are printed, not failures);
# - as root: installed, removed and purged with dpkg in a scratch root
#   (scripts/check-deb-install.sh: an overlay of this host's root, in a
#   mount namespace of its own, so the host is not changed), it leaves what
#   README.md ("A Debian package") says: installed, the group palisade,
#   /var/lib/palisade (0700), the minimal configuration, the manual pages
#   (man finds palisade(1), palisade-run(1) and palisaded(8)), and every
#   relative link of the installed documentation resolves but those to
#   source files (SOURCE_ONLY below); removed, the configuration (with the
#   administrator's change) and the state are kept, the programs and
#   documentation gone, and a broker started by hand (no systemd runs
#   there) stopped; purged, with mounts left under /run/palisade, those are
#   unmounted and the directory is gone, the configuration is gone too,
#   and the state (a journal's record) and the group are kept. Not root:
#   says that this part was not tried.
# Exits non-zero, saying what is wrong, on any failure.
# Usage: scripts/check-deb.sh [DEB, default the one target/debian/palisade_*.deb]
set -euo pipefail

# Without an argument: the one package build-deb.sh left in target/debian.
deb=${1:-}
if [ -z "$deb" ]; then
    debs=("$(dirname "$0")"/../target/debian/palisade_*.deb)
    [ ${#debs[@]} -eq 1 ] || { echo "check-deb: name the package: target/debian holds ${#debs[@]} of them" >&2; exit 1; }
    deb=${debs[0]}
fi
[ -f "$deb" ] || { echo "check-deb: no $deb: build it first (bash scripts/build-deb.sh)" >&2; exit 1; }
for tool in dpkg-deb lintian; do
    command -v "$tool" >/dev/null || { echo "check-deb: $tool is missing" >&2; exit 1; }
done

failures=()
fail() { failures+=("$*"); }

# path -> mode, as `dpkg-deb -c` prints them.
expected=(
    /usr/bin/palisaded -rwxr-xr-x
    /usr/bin/palisade -rwxr-xr-x
    /usr/bin/palisade-helper -rwxr-xr-x
    /usr/bin/palisade-plugin-host -rwxr-xr-x
    /usr/lib/systemd/system/palisade.service -rw-r--r--
    /usr/lib/systemd/system/palisade.socket -rw-r--r--
    /usr/lib/systemd/user/palisade.service -rw-r--r--
    /usr/lib/systemd/user/palisade.socket -rw-r--r--
    /usr/lib/sysusers.d/palisade.conf -rw-r--r--
    /usr/lib/tmpfiles.d/palisade.conf -rw-r--r--
    /etc/palisade/palisade.toml -rw-r--r--
    /etc/apparmor.d/palisade-helper -rw-r--r--
    /usr/share/man/man1/palisade.1.gz -rw-r--r--
    /usr/share/man/man1/palisade-run.1.gz -rw-r--r--
    /usr/share/man/man8/palisaded.8.gz -rw-r--r--
    /usr/share/doc/palisade/copyright -rw-r--r--
    /usr/share/doc/palisade/changelog.gz -rw-r--r--
    /usr/share/doc/palisade/README.md -rw-r--r--
    /usr/share/doc/palisade/ARCHITECTURE.md -rw-r--r--
    /usr/share/doc/palisade/docs/protocol.md -rw-r--r--
    /usr/share/doc/palisade/docs/journal.md -rw-r--r--
    /usr/share/doc/palisade/docs/security.md -rw-r--r--
    /usr/share/doc/palisade/examples/palisade.example.toml -rw-r--r--
    /usr/share/doc/palisade/palisade.example.toml lrwxrwxrwx
)

contents=$(dpkg-deb -c "$deb") || { echo "check-deb: dpkg-deb -c $deb failed" >&2; exit 1; }
echo "$contents"
echo
declare -A mode owner
while read -r perms own _size _date _time path _rest; do
    path=${path#.}
    path=${path%/}
    mode[${path:-/}]=$perms
    owner[${path:-/}]=$own
done <<<"$contents"

for ((i = 0; i < ${#expected[@]}; i += 2)); do
    path=${expected[i]} want=${expected[i + 1]}
    if [ -z "${mode[$path]:-}" ]; then
        fail "$path is missing"
    elif [ "${mode[$path]}" != "$want" ]; then
        fail "$path has mode ${mode[$path]}, not $want"
    fi
done
for path in "${!owner[@]}"; do
    [ "${owner[$path]}" = root/root ] || fail "$path is owned by ${owner[$path]}, not root/root"
    case ${mode[$path]} in
        l*) ;;
        d*) [ "${mode[$path]}" = drwxr-xr-x ] || fail "directory $path has mode ${mode[$path]}, not drwxr-xr-x" ;;
        ?????w???? | ????????w?) fail "$path is writable by group or others (${mode[$path]})" ;;
    esac
done

# The control archive: its members and their modes.
control=$(dpkg-deb --ctrl-tarfile "$deb" | tar -tvf -)
for member in postinst prerm postrm control conffiles md5sums; do
    perms=$(awk -v m="./$member" '$NF == m { print $1 }' <<<"$control")
    case $member in
        post* | pre*) want=-rwxr-xr-x ;;
        *) want=-rw-r--r-- ;;
    esac
    if [ -z "$perms" ]; then
        fail "DEBIAN/$member is missing"
    elif [ "$perms" != "$want" ]; then
        fail "DEBIAN/$member has mode $perms, not $want"
    fi
done
conffiles=$(dpkg-deb -I "$deb" conffiles 2>/dev/null || true)
for conffile in /etc/palisade/palisade.toml /etc/apparmor.d/palisade-helper; do
    grep -qxF "$conffile" <<<"$conffiles" || fail "DEBIAN/conffiles does not list $conffile"
done
while read -r conffile; do
    [ -z "$conffile" ] || [ -n "${mode[$conffile]:-}" ] || fail "DEBIAN/conffiles lists $conffile, which the package does not hold"
done <<<"$conffiles"

echo "lintian --fail-on error $deb"
if ! lintian --fail-on error "$deb"; then
    fail "lintian reports errors (above)"
fi

# The installed documentation's relative links that name source files, which
# the package does not install (macOS's units, the test guest's script, code).
SOURCE_ONLY=(launchd/ tests/vm/run-in-vm.sh tests/no-system-broker.toml broker/src/engine/cgroup.rs)

installed=not
if [ "$(id -u)" != 0 ]; then
    echo "check-deb: not root: installing, removing and purging the package was not tried"
elif ! command -v unshare >/dev/null; then
    fail "unshare (util-linux) is missing: installing, removing and purging the package was not tried"
else
    echo "dpkg -i, --remove, --purge in a scratch root"
    if out=$(unshare -m --propagation private bash "$(dirname "$0")/check-deb-install.sh" "$deb" "${SOURCE_ONLY[@]}" 2>&1); then
        installed=
        echo "$out"
    else
        echo "$out"
        fail "installing, removing or purging the package went wrong (above)"
    fi
fi

if [ ${#failures[@]} -gt 0 ]; then
    echo >&2
    printf 'check-deb: %s\n' "${failures[@]}" >&2
    echo "check-deb: $deb: ${#failures[@]} failure(s)" >&2
    exit 1
fi
echo "check-deb: $deb: contents, modes, conffiles and lintian all fine; ${installed:+not }installed, removed and purged"
