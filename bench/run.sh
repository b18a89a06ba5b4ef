#!/usr/bin/env bash
# palisade's benchmark, against its anchors, in one run on this machine.
#
#   bash bench/run.sh            the full run (about 5 minutes): the tables of bench/README.md
#   bash bench/run.sh --quick    one pass of everything, too few samples to compare (CI)
#
# Installs the anchors when missing (bubblewrap, hyperfine; util-linux for
# unshare), builds release binaries as an installation would
# (scripts/build-release.sh), runs target/release/palisade-bench with the
# arguments given, then, in a full run, has hyperfine time the same
# launchers for a second opinion.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v hyperfine >/dev/null || missing+=(hyperfine)
command -v unshare >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    if ! $sudo apt-get install -y --no-install-recommends "${missing[@]}"; then
        $sudo apt-get update
        $sudo apt-get install -y --no-install-recommends "${missing[@]}"
    fi
fi

# The plugin-host is among what it builds: the plugins section calls it.
bash scripts/build-release.sh -p palisade-bench
target/release/palisade-bench "$@"

case " $* " in *" --quick "*) exit 0 ;; esac

# The second opinion: hyperfine, no shell, the same commands.
work=$(mktemp -d)
trap 'kill "$daemon" 2>/dev/null || true; rm -rf "$work"' EXIT
# The socket in a directory of its own: the workspace may not lie in the broker's.
mkdir "$work/ws" "$work/run"
PALISADE_STATE="$work/state" PALISADE_JOURNAL="$work/journal" \
    target/release/palisaded --socket "$work/run/palisade.sock" 2>"$work/palisaded.log" &
daemon=$!
for _ in $(seq 100); do [ -S "$work/run/palisade.sock" ] && break; sleep 0.1; done
bwrap=(bwrap --unshare-all --die-with-parent --new-session)
for d in /usr /lib /lib64 /bin; do [ -e "$d" ] && bwrap+=(--ro-bind "$d" "$d"); done
bwrap+=(--proc /proc --dev /dev --tmpfs /tmp --bind "$work/ws" "$work/ws" --chdir "$work/ws" --clearenv)
cd "$work/ws"
echo "### hyperfine (same machine, right after; not interleaved)"
echo
hyperfine -N --warmup 20 --runs 300 --style none --export-json "$work/hyperfine.json" \
    -n "bare exec" "/bin/true" \
    -n "bwrap" "${bwrap[*]} /bin/true" \
    -n "palisade run" "$OLDPWD/target/release/palisade run --socket $work/run/palisade.sock -- /bin/true" \
    >/dev/null 2>&1
python3 - "$work/hyperfine.json" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
bwrap = next(r["median"] for r in results if r["command"] == "bwrap")
print("| command | median ms | mean ms | × bwrap (median) |")
print("|---|---:|---:|---:|")
for r in results:
    print(f"| {r['command']} | {r['median'] * 1e3:.2f} | {r['mean'] * 1e3:.2f} | {r['median'] / bwrap:.2f} |")
PY
