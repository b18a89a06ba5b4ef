#!/usr/bin/env bash
# Builds palisade for installation into target/release, with the binaries
# that start on every run linked statically: without the dynamic loader's
# work they start faster; see bench/README.md.
#
#   palisade-helper, palisade   static, against musl when its Rust target is
#                               installed or can be (rustup target add): glibc's
#                               start-up queries the CPU with CPUID, which traps
#                               to the hypervisor on virtual machines (0.3-0.4 ms
#                               of CPU per process here); musl's does not.
#                               Otherwise static against glibc. The helper is
#                               static-pie (its base randomized); the CLI is
#                               position-dependent: nothing to relocate at start
#                               (half the page faults), and it reads input from
#                               the broker only. It links no broker: without
#                               one it hands its process over to palisaded.
#   palisaded                   static-pie against glibc: it starts once, and
#                               glibc's allocator serves its runtime better.
#   palisade-plugin-host        dynamic (glibc).
#
# Each is built on its own, so that the broker's dependencies are compiled
# once, with the broker's features: packages built together unify their
# dependencies' features (the plugin-host's wasmtime asks more of serde,
# libc and rustix), and a build with other features is a second build of
# everything that depends on them. Extra arguments go to one more `cargo
# build` after these (for example -p palisade-bench, whose features are the
# broker's: nothing is compiled twice).
#
# PALISADE_LIBC=glibc skips musl.
set -euo pipefail
cd "$(dirname "$0")/.."
# crt-static is a property of the final link only: `cargo rustc` gives it
# to the binary, and the libraries are the broker's ordinary ones.
static=(-C target-feature=+crt-static)
cargo rustc --release --locked -p palisade-broker --bin palisaded -- "${static[@]}"
cargo build --release --locked -p palisade-plugins --bin palisade-plugin-host
[ $# -eq 0 ] || cargo build --release --locked "$@"

musl=x86_64-unknown-linux-musl
libc=${PALISADE_LIBC:-musl}
if [ "$libc" = musl ] && [ "$(uname -m)" = x86_64 ]; then
    if ! rustup target list --installed 2>/dev/null | grep -x "$musl" >/dev/null; then
        timeout 300 rustup target add "$musl" >/dev/null 2>&1 || {
            echo "build-release: the $musl target is not available; the helper and the CLI link glibc statically" >&2
            libc=glibc
        }
    fi
else
    libc=glibc
fi
if [ "$libc" = musl ]; then
    cargo build --release --locked --quiet --target "$musl" -p palisade-helper --bin palisade-helper
    cargo rustc --release --locked --quiet --target "$musl" -p palisade-cli --bin palisade -- -C relocation-model=static
    for b in palisade-helper palisade; do
        cp "target/$musl/release/$b" "target/release/$b.new"
        mv -f "target/release/$b.new" "target/release/$b"
    done
else
    cargo rustc --release --locked --quiet -p palisade-helper --bin palisade-helper -- "${static[@]}"
    cargo rustc --release --locked --quiet -p palisade-cli --bin palisade -- "${static[@]}" -C relocation-model=static
fi
for b in palisade-helper palisade palisaded; do
    linkage=$(ldd "target/release/$b" 2>&1 || true)
    if ! grep -qE "statically linked|not a dynamic executable" <<<"$linkage"; then
        echo "build-release: target/release/$b is still dynamically linked" >&2
        exit 1
    fi
done
echo "build-release: target/release/{palisade-helper,palisade} (static, $libc), target/release/palisaded (static, glibc)"
