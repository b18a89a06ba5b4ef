#!/usr/bin/env bash
# Builds palisade for installation into target/release, with the three
# binaries that start on every run (palisade-helper, palisade, palisaded)
# statically linked: without the dynamic loader's work they start in about
# half the time (see bench/README.md). Extra arguments go to `cargo build`.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked "$@"
# crt-static is a property of the final link only, so each binary is linked
# again with it; the libraries built above are reused.
for package_bin in palisade-helper:palisade-helper palisade-broker:palisade palisade-broker:palisaded; do
    cargo rustc --release --locked --quiet -p "${package_bin%%:*}" --bin "${package_bin##*:}" \
        -- -C target-feature=+crt-static
done
for b in palisade-helper palisade palisaded; do
    if ! ldd "target/release/$b" 2>&1 | grep -q "statically linked"; then
        echo "build-release: target/release/$b is still dynamically linked" >&2
        exit 1
    fi
done
echo "build-release: target/release/{palisade-helper,palisade,palisaded} (static)"
