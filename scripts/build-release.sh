#!/usr/bin/env bash
# Builds palisade for installation into target/release, with the binaries
# that start on every run linked statically: without the dynamic loader's
# work they start in about half the time; see bench/README.md. Extra
# arguments go to `cargo build`.
#
#   palisade-helper, palisaded  static-pie (randomized base kept)
#   palisade                    static, position-dependent: the CLI has
#                               nothing to relocate at start (a third less CPU
#                               again); it reads input from the broker only.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked "$@"
# crt-static is a property of the final link only, so each binary is linked
# again with it; the libraries built above are reused.
static=(-C target-feature=+crt-static)
cargo rustc --release --locked --quiet -p palisade-helper --bin palisade-helper -- "${static[@]}"
cargo rustc --release --locked --quiet -p palisade-broker --bin palisade -- "${static[@]}" -C relocation-model=static
cargo rustc --release --locked --quiet -p palisade-broker --bin palisaded -- "${static[@]}"
for b in palisade-helper palisade palisaded; do
    linkage=$(ldd "target/release/$b" 2>&1 || true)
    if ! grep -qE "statically linked|not a dynamic executable" <<<"$linkage"; then
        echo "build-release: target/release/$b is still dynamically linked" >&2
        exit 1
    fi
done
echo "build-release: target/release/{palisade-helper,palisade,palisaded} (static)"
