#!/usr/bin/env bash
# Checks the AppArmor profile (apparmor/palisade-helper) with
# `apparmor_parser -Q`: parsed and compiled, nothing loaded into the kernel.
#
# The profile needs AppArmor 4's `userns` rule. Where the installed parser is
# older (Debian 12 ships 3.0) or missing, Debian 13's parser and the C
# library it needs are downloaded (apt-get download, into a temporary
# directory) and run from there: nothing is installed on the host.
# A profile with a deliberate error is parsed too, and must be refused, so
# that a parser that accepts anything cannot pass the check.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=apparmor/palisade-helper

# The parser's major version; empty where it is not installed (a missing
# command is not an error here: the fallback below covers it).
major() { { "$@" --version 2>/dev/null || true; } | sed -n 's/^AppArmor parser version \([0-9]*\).*/\1/p' | head -1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
parser=(apparmor_parser)
base=/etc/apparmor.d
installed=$(major apparmor_parser)
if [ "${installed:-0}" -lt 4 ]; then
  echo "apparmor_parser ${installed:+$installed.x}${installed:-missing}: older than 4, using Debian 13's (unpacked in $work)"
  multiarch=$(gcc -print-multiarch)
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/parts" "$work/root"
  # The machine's own Debian archive, as apt is configured to reach it.
  mirror=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null | awk '$2 !~ /-/ {print $1; exit}')
  if [ -z "$mirror" ]; then
    echo "no Debian archive is configured for apt (apt-get indextargets names none): cannot fetch AppArmor 4's parser" >&2
    exit 1
  fi
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" > "$work/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/parts"
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" -qq update
  (cd "$work" && apt-get "${apt_opts[@]}" -qq download apparmor libc6)
  for deb in "$work"/apparmor_*.deb "$work"/libc6_*.deb; do dpkg-deb -x "$deb" "$work/root"; done
  lib="$work/root/usr/lib/$multiarch"
  parser=("$lib/ld-linux-x86-64.so.2" --library-path "$lib" "$work/root/usr/sbin/apparmor_parser")
  [ "$multiarch" = x86_64-linux-gnu ] || parser=("$lib"/ld-linux-*.so.* --library-path "$lib" "$work/root/usr/sbin/apparmor_parser")
  base="$work/root/etc/apparmor.d"
  parser+=(--config-file /dev/null)
fi
echo "$("${parser[@]}" --version | head -1)"

# The kernel may have no AppArmor here: -Q never loads, so that is fine; the
# parser's note about its cache says only that.
quiet() { grep -v 'Cache read/write disabled' || true; }

sed 's/^  userns,$/  userns,\n  no_such_rule,/' "$profile" > "$work/broken"
if "${parser[@]}" -Q --base "$base" "$work/broken" 2>/dev/null; then
  echo "the parser accepted a profile with an unknown rule: it checks nothing" >&2
  exit 1
fi
"${parser[@]}" -Q --base "$base" "$profile" 2> >(quiet >&2)
echo "$profile: parses (apparmor_parser -Q)"
