#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, through the libfuzzer-sys crate) of
# every decoder of untrusted input: fuzz/fuzz_targets/*.rs.
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--dev] [--minimize] [--build-only] [TARGET...]
#
# Builds the targets with coverage instrumentation (on the stable toolchain:
# the sancov pass, as cargo-fuzz does without a sanitizer), then runs each
# for N seconds (default 30) from its committed corpus (fuzz/corpus/TARGET),
# J at a time (default 1). New inputs that reach new coverage are added to
# the corpus. A crash, a hang (-timeout), or an allocation past the stated
# bound (-malloc_limit_mb, -rss_limit_mb) fails the run and leaves the input
# in fuzz/artifacts/TARGET/. Prints one line per target: runs, coverage,
# corpus size, and the verdict. --minimize then replaces each corpus with
# the smallest set of its inputs that keeps its coverage (libFuzzer's
# -set_cover_merge=1), which is what is committed.
# --dev builds unoptimized (the dev profile, line tables only): about a third
# of the release build's time, and some fifteen times fewer inputs a second.
# It is for a quick check: every committed input replayed, then a short
# run. Real runs use the optimized build. --build-only builds and runs
# nothing. (The test suite replays every committed input without libFuzzer:
# tests/tests/all/fuzz_corpus.rs.)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30
jobs=1
minimize=false
build_only=false
profile=release
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --minimize) minimize=true; shift ;;
    --dev) profile=dev; shift ;;
    --build-only) build_only=true; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
all=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^palisade-fuzz$')
[ ${#targets[@]} -gt 0 ] || read -r -a targets <<<"$(echo $all)"

# The bounds every target is held to.
MALLOC_LIMIT_MB=256   # no single allocation past this
RSS_LIMIT_MB=1024     # no run past this resident size
TIMEOUT_SECS=5        # no input slower than this: a hang
MAX_LEN=65536         # inputs up to this size

export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
target_triple=$(rustc -vV | sed -n 's/^host: //p')
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
cargo build --quiet --profile "$profile" --locked --manifest-path fuzz/Cargo.toml --target "$target_triple" \
  --target-dir fuzz/target "${bins[@]}"
$build_only && exit 0
bin=fuzz/target/$target_triple/$([ "$profile" = dev ] && echo debug || echo release)

run_one() {
  local t=$1 corpus=fuzz/corpus/$1 artifacts=fuzz/artifacts/$1/ log
  mkdir -p "$corpus" "$artifacts"
  log=$(mktemp)
  if "$bin/$t" "$corpus" -max_total_time="$seconds" -malloc_limit_mb=$MALLOC_LIMIT_MB \
      -rss_limit_mb=$RSS_LIMIT_MB -timeout=$TIMEOUT_SECS -max_len=$MAX_LEN \
      -artifact_prefix="$artifacts" -print_final_stats=1 >"$log" 2>&1; then
    verdict=ok
  else
    verdict="FAILED (see $artifacts and the log below)"
  fi
  local runs cov
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  printf '%-16s %8ss  runs %-10s cov %-6s corpus %-5s %s\n' "$t" "$seconds" "${runs:-?}" "${cov:-?}" \
    "$(ls "$corpus" | wc -l)" "$verdict"
  if [ "$verdict" != ok ]; then tail -40 "$log"; rm -f "$log"; return 1; fi
  rm -f "$log"
  if $minimize; then
    local merged
    merged=$(mktemp -d)
    "$bin/$t" -set_cover_merge=1 -max_len=$MAX_LEN "$merged" "$corpus" >/dev/null 2>&1
    rm -rf "$corpus" && mv "$merged" "$corpus" && chmod 755 "$corpus"
    echo "$t: corpus minimized to $(ls "$corpus" | wc -l) inputs"
  fi
}

failed=0
running=0
for t in "${targets[@]}"; do
  run_one "$t" & running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait -n || failed=1; running=$((running - 1)); fi
done
while [ "$running" -gt 0 ]; do wait -n || failed=1; running=$((running - 1)); done
exit $failed
