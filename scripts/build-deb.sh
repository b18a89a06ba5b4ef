#!/usr/bin/env bash
# Builds the Debian package palisade_<version>_<arch>.deb from the binaries
# scripts/build-release.sh left in target/release, with `dpkg-deb --build
# --root-owner-group` (no debhelper, no cargo-deb). <version> is the
# workspace's ([workspace.package] in Cargo.toml; a pre-release's `-` becomes
# `~`, which sorts before the release as in Cargo), <arch> is
# `dpkg --print-architecture`. The package is native: the project is its own
# upstream, so its Debian changelog is /usr/share/doc/palisade/changelog.gz
# (changelog.Debian.gz is the name for packages of someone else's source).
#
#   scripts/build-deb.sh [--release-dir DIR] [--out DIR] [--man-from PROGRAM] [--check]
#   --release-dir  where the binaries are (default target/release)
#   --man-from     the manual pages' generator, already built from this tree
#                  (target/debug/examples/man after `cargo test --workspace`);
#                  by default `cargo run --example man` builds it
#   --out          where the .deb goes (default target/debian)
#   --check        then run scripts/check-deb.sh on it (contents, modes,
#                  conffiles, lintian)
#
# DEBFULLNAME and DEBEMAIL name the maintainer (default: palisade developers
# <palisade@example.org>). SOURCE_DATE_EPOCH, or else the last commit's time,
# dates the changelog entry and every file: the same tree gives the same
# package.
#
# What it installs:
#   /usr/bin/{palisaded,palisade,palisade-helper,palisade-plugin-host}
#       stripped copies (the broker finds the helper next to itself, and the
#       plugin-host next to the helper; the AppArmor profile attaches to
#       /usr/bin/palisade-helper)
#   /usr/share/man/man1/palisade.1.gz, palisade-<subcommand>.1.gz and
#   /usr/share/man/man8/palisaded.8.gz
#       generated from the CLI's definitions by broker/examples/man.rs (an
#       example, so that the generator is linked into no binary; this runs it
#       with cargo, or the build --man-from names), dated like everything
#       else, gzip -9n
#   /usr/lib/systemd/system/palisade.{service,socket}  from systemd/
#   /usr/lib/systemd/user/palisade.{service,socket}    from systemd/user/, the
#       service's ExecStart= pointed at /usr/bin/palisaded (the file in the
#       tree starts ~/.local/bin/palisaded, a per-user install's)
#   /usr/lib/sysusers.d/palisade.conf   the system group `palisade`, the
#       socket unit's SocketGroup=, and the system user `palisade` in it, the
#       service's User= (it holds the unit's capabilities and acts as each
#       requester), with no login.
#   /usr/lib/tmpfiles.d/palisade.conf   /var/lib/palisade, palisade:palisade
#       0700: the system broker's state directory (the audit journal, trust
#       stages, change sets, skills and secrets), as the service's
#       StateDirectory= makes it. With a journal reader_gid the broker opens
#       it to that group, search only (docs/journal.md).
#   /etc/palisade/palisade.toml         deploy/debian/palisade.toml, a conffile:
#       the keys an administrator must look at (who is served: the group
#       palisade; the journal's readers), nothing else
#   /etc/apparmor.d/palisade-helper     apparmor/palisade-helper; a conffile
#   /usr/share/doc/palisade/            copyright, changelog.gz, and the
#       documentation where README.md's relative links expect it: README.md
#       (what the service's Documentation= names), ARCHITECTURE.md, docs/,
#       bench/README.md, fuzz/README.md, deploy/kubernetes/, and
#       examples/palisade.example.toml (every key, annotated) with
#       palisade.example.toml a link to it; systemd/ and apparmor/ hold links
#       to the installed units and profile. Left uncompressed (Debian Policy
#       12.3 says "should" for large ones) so that those links, and
#       Documentation=, find them. README.md's links to source files (launchd/,
#       tests/vm/, fuzz/'s targets) have nothing installed behind them:
#       scripts/check-deb.sh lists them.
#   /usr/share/lintian/overrides/palisade  (see below)
#
# Maintainer scripts (sh, no debhelper):
#   postinst  creates the user and group (systemd-sysusers) and the state directory
#             (systemd-tmpfiles) where those tools exist, loads the AppArmor
#             profile where AppArmor is enabled (a parser too old for its
#             `abi <abi/4.0>`, Debian 12's, says so in one line: only hosts
#             that restrict user namespaces, Ubuntu 23.10 and later with
#             AppArmor 4, need it), `systemctl daemon-reload` when systemd
#             runs, and on an upgrade restarts palisade.service if it is
#             running (deb-systemd-invoke try-restart): a running broker
#             spawns /usr/bin/palisade-helper for every run, which must be of
#             its own version.
#             It never enables or starts anything: a system broker serves
#             the users in allowed_uids and allowed_gids, which the operator
#             checks in /etc/palisade/palisade.toml first, then
#             `systemctl enable --now palisade.socket`.
#   prerm     on removal stops palisade.socket and palisade.service, then
#             any palisaded still running from /usr/bin (one started by hand
#             on a host without systemd, a user's own, an embedded broker:
#             start-stop-daemon --stop --exec, TERM then KILL after 30 s),
#             and unloads the AppArmor profile.
#   postrm    `systemctl daemon-reload`; on purge, removes the profile's
#             compiled cache and the runtime directory /run/palisade (the
#             socket's, and the runs' directories), after unmounting
#             (umount -l, deepest first) whatever is mounted under it, and
#             says what it keeps.
#             dpkg itself removes the conffiles (/etc/palisade/palisade.toml,
#             the profile) on purge, and keeps them on removal.
#             Kept, even on purge: the state directory /var/lib/palisade
#             (the audit journal is the administrator's record of what ran,
#             and held change sets are users' work not yet applied), and the
#             group palisade (as Debian keeps system groups: files may still
#             carry its gid). README.md ("A Debian package") says how to
#             remove them by hand; scripts/check-deb.sh installs, removes
#             and purges the package in a scratch root to show all this.
#
# Depends: only what dpkg-shlibdeps finds for the binaries that are linked
# dynamically (after build-release.sh, palisade-plugin-host alone: libc6,
# libgcc-s1). Nothing for systemd: without it the package works (the CLI's
# embedded broker, a broker started by hand) and the units and the group,
# which only they use, do not matter; with it, systemd-sysusers is there.
# A binary static against glibc makes the package Built-Using glibc.
# Suggests: apparmor.
#
# lintian (2.116, Debian 12's) reports no error. It is told, in
# /usr/share/lintian/overrides/palisade, that the binaries are static on
# purpose (statically-linked-binary for a static executable, an error, and
# shared-library-lacks-prerequisites for a static-pie, a warning; only those
# it would report), and that palisade-helper and palisade-plugin-host, which
# palisaded spawns, need no manual page. What remains:
#   I package-supports-alternative-init-but-no-init.d-script: systemd units
#     only; elsewhere run palisaded by hand.
#   I hardening-no-fortify-functions [usr/bin/palisade-plugin-host]: Rust
#     code calls none of glibc's fortifiable functions.
#   I spelling-error-in-binary: byte sequences in the binaries, not words.
set -euo pipefail

usage() { sed -n '/^#   scripts\/build-deb.sh/,/^#$/{/^#$/d;s/^#   //p}' "$0"; }
die() { echo "build-deb: $*" >&2; exit 1; }

release_dir=target/release
out_dir=target/debian
man_from=
check=0
while [ $# -gt 0 ]; do
    case "$1" in
        --release-dir) [ $# -ge 2 ] || die "--release-dir needs a directory"; release_dir=$2; shift 2 ;;
        --release-dir=*) release_dir=${1#*=}; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a directory"; out_dir=$2; shift 2 ;;
        --out=*) out_dir=${1#*=}; shift ;;
        --man-from) [ $# -ge 2 ] || die "--man-from needs a program"; man_from=$2; shift 2 ;;
        --man-from=*) man_from=${1#*=}; shift ;;
        --check) check=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
done
# Relative to where it was called from; then work from the repository.
release_dir=$(realpath -m -- "$release_dir")
out_dir=$(realpath -m -- "$out_dir")
if [ -n "$man_from" ]; then
    given=$man_from
    man_from=$(realpath -e -- "$given" 2>/dev/null) && [ -x "$man_from" ] ||
        die "--man-from: no program at $given"
fi
cd "$(dirname "$0")/.."

for tool in dpkg-deb dpkg readelf strip gzip cargo; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done

# A key of [workspace.package] in Cargo.toml.
workspace_key() {
    awk -v key="$1" '
        /^\[/ { section = ($0 == "[workspace.package]") }
        section && $1 == key && $2 == "=" { sub(/^[^=]*=[ \t]*"/, ""); sub(/".*$/, ""); print; exit }
    ' Cargo.toml
}
cargo_version=$(workspace_key version)
license=$(workspace_key license)
homepage=$(workspace_key repository)
[ -n "$cargo_version" ] || die "no version in Cargo.toml's [workspace.package]"
version=${cargo_version//-/\~}
[[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]] || die "version $cargo_version does not make a Debian version"
# The copyright file below carries Apache-2.0's notice.
[ "$license" = Apache-2.0 ] || die "Cargo.toml's license is $license: update the copyright text in $0"
arch=$(dpkg --print-architecture)
maintainer="${DEBFULLNAME:-palisade developers} <${DEBEMAIL:-palisade@example.org}>"

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
fi
export SOURCE_DATE_EPOCH
first_year=$(git log --max-parents=0 --format=%cd --date=format:%Y 2>/dev/null | sort | sed -n 1p)
last_year=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y)
first_year=${first_year:-$last_year}
years=$first_year
[ "$first_year" = "$last_year" ] || years="$first_year-$last_year"

binaries=(palisaded palisade palisade-helper palisade-plugin-host)
for b in "${binaries[@]}"; do
    [ -f "$release_dir/$b" ] && [ -x "$release_dir/$b" ] ||
        die "no $b in $release_dir: build it first (bash scripts/build-release.sh)"
done
# The documentation, where README.md's relative links expect it (under
# /usr/share/doc/palisade).
docs=(README.md ARCHITECTURE.md docs/*.md docs/palisade.cedarschema bench/README.md
    fuzz/README.md deploy/kubernetes/README.md deploy/kubernetes/daemonset.yaml
    clients/python/README.md clients/python/pyproject.toml clients/python/src/palisade_client/__init__.py
    clients/python/src/palisade_client/__main__.py clients/python/src/palisade_client/py.typed
    clients/python/tests/check_client.py)
for f in systemd/palisade.service systemd/palisade.socket systemd/user/palisade.service \
    systemd/user/palisade.socket apparmor/palisade-helper palisade.example.toml deploy/debian/palisade.toml \
    "${docs[@]}"; do
    [ -f "$f" ] || die "$f is missing"
done

mkdir -p "$out_dir"
root=$(mktemp -d "$out_dir/.root.XXXXXX")
trap 'rm -rf "$root"' EXIT
umask 022
chmod 0755 "$root"
doc=$root/usr/share/doc/palisade
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/systemd/system" "$root/usr/lib/systemd/user" \
    "$root/usr/lib/sysusers.d" "$root/usr/lib/tmpfiles.d" "$root/etc/palisade" "$root/etc/apparmor.d" "$doc" \
    "$root/usr/share/man/man1" "$root/usr/share/man/man8"

# Binaries: stripped (as dh_strip does) when they still have a symbol table.
shlib_bins=()
overrides=()
built_using=
for b in "${binaries[@]}"; do
    dest=$root/usr/bin/$b
    install -m 0755 "$release_dir/$b" "$dest"
    if readelf -S --wide "$dest" | grep ' \.symtab ' >/dev/null; then
        strip --remove-section=.comment --remove-section=.note "$dest"
    fi
    if readelf -d "$dest" 2>/dev/null | grep '(NEEDED)' >/dev/null; then
        shlib_bins+=("$dest")
        continue
    fi
    # Static, as build-release.sh means it: lintian takes a static executable
    # for a mistake, and a static-pie (type DYN, no NEEDED) for a library
    # without its dependencies.
    if readelf -h "$dest" | grep -Eq '^ *Type: *EXEC'; then
        overrides+=("# Static on purpose (scripts/build-release.sh): it starts on every call." \
            "statically-linked-binary [usr/bin/$b]")
    else
        overrides+=("# A static-pie executable (scripts/build-release.sh), not a library." \
            "shared-library-lacks-prerequisites [usr/bin/$b]")
    fi
    # Static against glibc (its crt1.o brings the ABI note; musl has none):
    # glibc's source is part of the package (Debian Policy 7.8).
    if [ -z "$built_using" ] && readelf -n "$dest" | grep 'NT_GNU_ABI_TAG' >/dev/null; then
        built_using=$(dpkg-query -W -f='${source:Package} (= ${source:Version})' libc6-dev 2>/dev/null || true)
    fi
done

depends=
if [ ${#shlib_bins[@]} -gt 0 ]; then
    command -v dpkg-shlibdeps >/dev/null ||
        die "${shlib_bins[*]##*/} linked dynamically: dpkg-shlibdeps (Debian package dpkg-dev) is needed for Depends"
    # dpkg-shlibdeps wants a source tree's debian/control.
    mkdir "$root.src" && trap 'rm -rf "$root" "$root.src"' EXIT
    mkdir "$root.src/debian"
    printf 'Source: palisade\n\nPackage: palisade\nArchitecture: any\n' >"$root.src/debian/control"
    depends=$(cd "$root.src" && dpkg-shlibdeps -O "${shlib_bins[@]}" | sed -n 's/^shlibs:Depends=//p')
fi

install -m 0644 systemd/palisade.service systemd/palisade.socket "$root/usr/lib/systemd/system/"
install -m 0644 systemd/user/palisade.socket "$root/usr/lib/systemd/user/"
sed -E 's|^ExecStart=([^ ]*/)?palisaded( .*)?$|ExecStart=/usr/bin/palisaded\2|' systemd/user/palisade.service \
    >"$root/usr/lib/systemd/user/palisade.service"
chmod 0644 "$root/usr/lib/systemd/user/palisade.service"
grep -q '^ExecStart=/usr/bin/palisaded\( \|$\)' "$root/usr/lib/systemd/user/palisade.service" ||
    die "systemd/user/palisade.service: no ExecStart= of palisaded to point at /usr/bin/palisaded"

cat >"$root/usr/lib/sysusers.d/palisade.conf" <<'EOF'
# The group whose members may connect to the system broker's socket
# (palisade.socket: SocketGroup=palisade); add them to allowed_gids too.
g palisade -
# The system broker's own user (palisade.service: User=palisade), in that
# group; it holds the unit's capabilities, and no login.
u palisade - "palisade sandbox broker" /var/lib/palisade /usr/sbin/nologin
EOF
cat >"$root/usr/lib/tmpfiles.d/palisade.conf" <<'EOF'
# The system broker's state: the audit journal, trust stages, skills and
# secrets (palisade.service: StateDirectory=palisade, StateDirectoryMode=0700).
d /var/lib/palisade 0700 palisade palisade -
EOF
chmod 0644 "$root/usr/lib/sysusers.d/palisade.conf" "$root/usr/lib/tmpfiles.d/palisade.conf"

install -m 0644 deploy/debian/palisade.toml "$root/etc/palisade/palisade.toml"
install -m 0644 apparmor/palisade-helper "$root/etc/apparmor.d/palisade-helper"

# The manual pages, from the CLI's definitions (this tree's, whatever binaries
# --release-dir names), dated as the rest of the package.
# Without SOURCE_DATE_EPOCH in cargo's environment: the cc crate's build
# scripts (psm, under Cedar) watch it, and a change rebuilds every crate
# that depends on them, here and again in the next build without it.
pages=$root/man.tmp
man=(env -u SOURCE_DATE_EPOCH cargo run --locked --quiet -p palisade-broker --example man --)
[ -z "$man_from" ] || man=("$man_from")
"${man[@]}" "$pages" --date "$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)" >/dev/null ||
    die "broker/examples/man.rs failed"
for page in "$pages"/*.[18]; do
    section=${page##*.}
    gzip -9n <"$page" >"$root/usr/share/man/man$section/${page##*/}.gz"
    chmod 0644 "$root/usr/share/man/man$section/${page##*/}.gz"
done
rm -r "$pages"
[ -f "$root/usr/share/man/man1/palisade.1.gz" ] && [ -f "$root/usr/share/man/man8/palisaded.8.gz" ] ||
    die "broker/examples/man.rs wrote no palisade.1 or palisaded.8"

for f in "${docs[@]}"; do
    install -D -m 0644 "$f" "$doc/$f"
done
install -D -m 0644 palisade.example.toml "$doc/examples/palisade.example.toml"
# What README.md's links name, where the package has it: the example, the
# units and the profile as installed.
ln -s examples/palisade.example.toml "$doc/palisade.example.toml"
install -d "$doc/systemd/user" "$doc/apparmor"
for unit in palisade.service palisade.socket; do
    ln -s "../../../../lib/systemd/system/$unit" "$doc/systemd/$unit"
    ln -s "../../../../../lib/systemd/user/$unit" "$doc/systemd/user/$unit"
done
ln -s /etc/apparmor.d/palisade-helper "$doc/apparmor/palisade-helper"
cat >"$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: palisade
Upstream-Contact: $maintainer
Source: $homepage
Comment: Binaries linked statically contain, besides palisade's own code,
 the Rust standard library and the crates palisade depends on (Cargo.lock),
 each under its own license, and a C library: GNU libc (LGPL-2.1+, named in
 Built-Using) or musl (MIT).

Files: *
Copyright: $years palisade developers
License: Apache-2.0

License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the "License"); you may not
 use this file except in compliance with the License. You may obtain a copy
 of the License at
 .
     https://www.apache.org/licenses/LICENSE-2.0
 .
 Unless required by applicable law or agreed to in writing, software
 distributed under the License is distributed on an "AS IS" BASIS, WITHOUT
 WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied. See the
 License for the specific language governing permissions and limitations
 under the License.
 .
 On Debian systems, the complete text of the Apache License, Version 2.0
 can be found in "/usr/share/common-licenses/Apache-2.0".
EOF
cat >"$root/changelog" <<EOF
palisade ($version) unstable; urgency=medium

  * palisade $cargo_version.

 -- $maintainer  $(date -u -R -d "@$SOURCE_DATE_EPOCH")
EOF
gzip -9n <"$root/changelog" >"$doc/changelog.gz"
rm "$root/changelog"
chmod 0644 "$doc/copyright" "$doc/changelog.gz"

overrides+=("# Spawned by palisaded, never run by hand (the AppArmor profile and the" \
    "# broker's defaults want them next to it, in /usr/bin)." \
    "no-manual-page [usr/bin/palisade-helper]" "no-manual-page [usr/bin/palisade-plugin-host]")
install -d "$root/usr/share/lintian/overrides"
printf '%s\n' "${overrides[@]}" >"$root/usr/share/lintian/overrides/palisade"
chmod 0644 "$root/usr/share/lintian/overrides/palisade"

# Maintainer scripts.
apparmor_enabled='apparmor_enabled() {
    if command -v aa-enabled >/dev/null 2>&1; then
        aa-enabled --quiet 2>/dev/null
    else
        [ "$(cat /sys/module/apparmor/parameters/enabled 2>/dev/null)" = Y ]
    fi
}'
cat >"$root/DEBIAN/postinst" <<EOF
#!/bin/sh
# Nothing is enabled or started: check who is served (allowed_uids,
# allowed_gids) in /etc/palisade/palisade.toml, then
# \`systemctl enable --now palisade.socket\`.
set -e

$apparmor_enabled

case "\$1" in
configure | abort-upgrade | abort-deconfigure | abort-remove)
    if command -v systemd-sysusers >/dev/null 2>&1; then
        systemd-sysusers palisade.conf
    fi
    if command -v systemd-tmpfiles >/dev/null 2>&1; then
        systemd-tmpfiles --create palisade.conf || true
    fi
    if [ ! -e /etc/apparmor.d/disable/palisade-helper ] && command -v apparmor_parser >/dev/null 2>&1 &&
        apparmor_enabled; then
        apparmor_parser -r -T -W /etc/apparmor.d/palisade-helper 2>/dev/null ||
            echo "palisade: /etc/apparmor.d/palisade-helper not loaded (apparmor_parser -r says why); 'palisade doctor' says whether this host needs it" >&2
    fi
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        # A running broker must spawn a helper of its own version.
        if [ "\$1" = configure ] && [ -n "\$2" ] && command -v deb-systemd-invoke >/dev/null 2>&1; then
            deb-systemd-invoke try-restart palisade.service >/dev/null || true
        fi
    fi
    ;;
esac

exit 0
EOF
cat >"$root/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e

$apparmor_enabled

if [ "\$1" = remove ]; then
    if [ -d /run/systemd/system ] && command -v deb-systemd-invoke >/dev/null 2>&1; then
        deb-systemd-invoke stop palisade.socket palisade.service >/dev/null || true
    fi
    # A broker started without systemd (by hand, an init script, a user's
    # own): its program and the helper it spawns are about to go. TERM
    # first, as systemd's stop does (TimeoutStopSec=30), then KILL; none
    # running is not an error.
    if command -v start-stop-daemon >/dev/null 2>&1; then
        start-stop-daemon --stop --quiet --oknodo --retry TERM/30/KILL/5 --exec /usr/bin/palisaded ||
            echo "palisade: a palisaded still runs (start-stop-daemon --stop failed)" >&2
    fi
    if command -v apparmor_parser >/dev/null 2>&1 && apparmor_enabled; then
        apparmor_parser -R /etc/apparmor.d/palisade-helper >/dev/null 2>&1 || true
    fi
fi

exit 0
EOF
cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
# Kept on purge: the state directory /var/lib/palisade (the audit journal,
# the administrator's record of what ran; change sets, users' work not yet
# applied) and the user and group palisade. dpkg removes the conffiles itself.
set -e

case "$1" in
remove | purge)
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
    fi
    ;;
esac
if [ "$1" = purge ]; then
    rm -f /var/cache/apparmor/*/palisade-helper /etc/apparmor.d/cache/palisade-helper
    # The socket's directory and the runs' (the units keep it across
    # restarts). What is mounted under it first (a run's mounts a crash left,
    # a bind mount), deepest first, as this mount namespace sees it
    # (/proc/self/mountinfo's fifth field, octal escapes undone): rm would
    # stop at each, and fail the purge. Again while that uncovers more (a
    # mount over /run/palisade hides those beneath it).
    if [ -r /proc/self/mountinfo ] && command -v umount >/dev/null 2>&1; then
        mounted() {
            while read -r _id _parent _dev _root point _rest; do
                case $point in /run/palisade | /run/palisade/*) printf '%s\n' "$point" ;; esac
            done </proc/self/mountinfo | sed 's/\\040/ /g; s/\\011/\t/g; s/\\134/\\/g' | LC_ALL=C sort -r
        }
        left=$(mounted)
        passes=0
        while [ -n "$left" ] && [ "$passes" -lt 8 ]; do
            printf '%s\n' "$left" | while IFS= read -r point; do
                umount -l "$point" 2>/dev/null || true
            done
            passes=$((passes + 1))
            left=$(mounted)
        done
        [ -z "$left" ] || echo "palisade: still mounted under /run/palisade: $left" >&2
    fi
    rm -rf --one-file-system /run/palisade ||
        echo "palisade: /run/palisade is not removed entirely (above)" >&2
    if [ -d /var/lib/palisade ]; then
        echo "palisade: /var/lib/palisade is kept (the audit journal, held change sets): remove it by hand once archived" >&2
    fi
fi

exit 0
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

printf '%s\n' /etc/apparmor.d/palisade-helper /etc/palisade/palisade.toml >"$root/DEBIAN/conffiles"

# Installed-Size as dpkg-gencontrol counts it: KiB per file, rounded up, and
# one per directory or other entry.
installed_size=$(find "$root" -mindepth 1 -path "$root/DEBIAN" -prune -o -printf '%y %s\n' |
    awk '$1 == "f" { n += int(($2 + 1023) / 1024); next } { n += 1 } END { print n }')

{
    echo "Package: palisade"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: $maintainer"
    echo "Installed-Size: $installed_size"
    [ -z "$depends" ] || echo "Depends: $depends"
    echo "Suggests: apparmor"
    [ -z "$built_using" ] || echo "Built-Using: $built_using"
    echo "Section: admin"
    echo "Priority: optional"
    echo "Homepage: $homepage"
    cat <<'EOF'
Description: sandbox broker for AI-agent tool execution
 palisade runs the commands that AI agents (coding assistants, automation
 bots) ask for, under policy: each request is checked and resolved into a
 sandbox before anything runs, or refused, and every request, decision and
 run is recorded in a hash-chained audit journal.
 .
 The sandboxes use user namespaces, a private read-only root, Landlock,
 seccomp, rlimits and cgroup v2 limits, with network access restricted to
 allowed names; WebAssembly skills run in a wasmtime plugin host.
 .
 This package contains the broker (palisaded), the command-line client
 (palisade), the helper that builds each sandbox (palisade-helper), the
 WebAssembly plugin host (palisade-plugin-host), systemd units for a system
 broker and a per-user one, and an AppArmor profile for hosts that restrict
 unprivileged user namespaces. The system broker is not enabled on
 installation: check who it serves (by default the members of the group
 palisade) in /etc/palisade/palisade.toml first.
EOF
} >"$root/DEBIAN/control"

(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
    xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$out_dir/palisade_${version}_${arch}.deb
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "build-deb: $deb"

if [ "$check" = 1 ]; then
    bash scripts/check-deb.sh "$deb"
fi
