#!/usr/bin/env bash
# Checks the Debian package scripts/build-deb.sh built:
# - every path it should install is there (`dpkg-deb -c`), owned by
#   root/root, with its mode;
# - the maintainer scripts are there and executable, and DEBIAN/conffiles
#   lists /etc/palisade/palisade.toml and /etc/apparmor.d/palisade-helper;
# - `lintian --fail-on error` passes (warnings are printed, not failures).
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
    /usr/share/doc/palisade/copyright -rw-r--r--
    /usr/share/doc/palisade/changelog.gz -rw-r--r--
    /usr/share/doc/palisade/README.md -rw-r--r--
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

if [ ${#failures[@]} -gt 0 ]; then
    echo >&2
    printf 'check-deb: %s\n' "${failures[@]}" >&2
    echo "check-deb: $deb: ${#failures[@]} failure(s)" >&2
    exit 1
fi
echo "check-deb: $deb: contents, modes, conffiles and lintian all fine"
