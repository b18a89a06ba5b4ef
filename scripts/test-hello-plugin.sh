#!/usr/bin/env bash
# Builds the Rust example plugin (examples/hello-plugin) for
# wasm32-unknown-unknown, adding the target if it is missing, and runs the
# plugins crate's test that compiles and calls it through palisade-plugin-host.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup target list --installed | grep -x wasm32-unknown-unknown >/dev/null; then
  rustup target add wasm32-unknown-unknown
fi
cargo build --release --target wasm32-unknown-unknown --manifest-path examples/hello-plugin/Cargo.toml
cargo test -p palisade-plugins --test host -- --ignored the_rust_example_plugin
