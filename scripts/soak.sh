#!/usr/bin/env bash
# The soak and the load (tests/tests/all/soak.rs) at full size, against a
# release build, with their figures printed:
#
#   soak   10,000 runs through one daemon, every kind in turn (short, with
#          output, killed at the deadline, over quota, refused, cancelled,
#          client gone): the processes, descriptors, mounts and run
#          directories left, and the daemon's RSS after a warm-up and after
#   load   1,000 clients at once against the default limits, five times:
#          results and Busy, runs per second, p50/p99, peak RSS and
#          descriptors, RSS once idle again
#
#   scripts/soak.sh [RUNS [CLIENTS [BURSTS]]]     (defaults 10000 1000 5)
#
# The suite runs both in short versions (350 runs, two bursts) on every
# change; bench/README.md records what this script printed.
set -euo pipefail
cd "$(dirname "$0")/.."
export PALISADE_SOAK_RUNS=${1:-10000} PALISADE_LOAD_CLIENTS=${2:-1000} PALISADE_LOAD_BURSTS=${3:-5}
# The daemon, helper and probe the test drives, built first (a test of one
# package builds no other package's binaries).
cargo build --release --locked --workspace --bins
cargo test --release --locked -p palisade-tests --features slow --test all -- soak:: --nocapture --test-threads 1
