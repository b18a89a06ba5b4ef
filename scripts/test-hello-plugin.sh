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
# The whole workspace's tests with the suite's features (.ci/run's), filtered
# to the one test: the test binaries the suite built are the ones run, where
# selecting one package or one target would build them again with other
# features (each package's dev-dependencies' features are unified with the
# others' only when all are built).
cargo test --workspace --locked --features palisade-tests/slow -- --ignored --exact the_rust_example_plugin
