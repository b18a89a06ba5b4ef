#!/usr/bin/env bash
# Runs the Windows job mechanics (windows/tests/job.rs) as a Windows program
# under Wine: a run's processes in one Job Object, killed when it closes, at
# the deadline, past the output quota, when cancelled and when the command
# exits; no breaking away. What Wine cannot show is listed by the program
# and runs on Windows only (docs/windows.md). Arguments: parts of the names
# of the checks to run (all when none).
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's wine64 package installs the loader here, without a `wine` on PATH.
wine=${WINE:-$(command -v wine64 || command -v wine || echo /usr/lib/wine/wine64)}
[ -x "$wine" ] || { echo "wine-test: Wine is not installed (Debian: apt-get install wine64)" >&2; exit 2; }
command -v x86_64-w64-mingw32-gcc >/dev/null ||
  { echo "wine-test: MinGW's C compiler is not installed (Debian: gcc-mingw-w64-x86-64-win32)" >&2; exit 2; }
rustup target list --installed | grep -qx x86_64-pc-windows-gnu ||
  { echo "wine-test: the Rust target x86_64-pc-windows-gnu is not installed (rustup target add x86_64-pc-windows-gnu)" >&2; exit 2; }

# A prefix of palisade's own under target/, made on first use.
export WINEPREFIX="$PWD/target/wine" WINEDEBUG=-all
if [ ! -d "$WINEPREFIX/drive_c/windows/system32" ]; then
  "$wine" wineboot --init >/dev/null 2>&1 || true
fi
[ -d "$WINEPREFIX/drive_c/windows/system32" ] || { echo "wine-test: Wine could not make its prefix $WINEPREFIX" >&2; exit 1; }
# Rust's standard library needs bcryptprimitives.dll (ProcessPrng), which
# Wine 8 lacks: a stand-in built from windows/wine/ (RtlGenRandom underneath).
x86_64-w64-mingw32-gcc -shared -O2 -o "$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll" \
  windows/wine/bcryptprimitives.c windows/wine/bcryptprimitives.def -ladvapi32

# A check that hangs fails here, in minutes.
CC_x86_64_pc_windows_gnu=x86_64-w64-mingw32-gcc CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER="$wine" timeout 900 \
  cargo test --locked --quiet --target x86_64-pc-windows-gnu -p palisade-windows --test job -- "$@"
