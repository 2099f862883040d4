#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 30) each and prints the executions.
# Usage: fuzz/run.sh [SECONDS | --build-only]. Needs cargo-fuzz (`cargo install cargo-fuzz`); works on
# stable Rust through RUSTC_BOOTSTRAP=1 (cargo-fuzz passes nightly-only flags).
# A crash fails the run; the input is left in fuzz/artifacts/TARGET/ to reproduce with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
export RUSTC_BOOTSTRAP=1
# Instrumented builds must not share (and rebuild) the main target directory.
export CARGO_TARGET_DIR=${LOCALVOL_FUZZ_TARGET_DIR:-$PWD/fuzz/target}
command -v cargo-fuzz >/dev/null || { echo "fuzz/run.sh: cargo install cargo-fuzz" >&2; exit 1; }

targets=$(cargo fuzz list)
# Debug assertions on (overflow checks catch size arithmetic bugs); no sanitizer:
# the code under test is safe Rust. A dev build whose code under test is optimised
# (fuzz/Cargo.toml): every dependency of the crate is compiled with the coverage
# instrumentation, and fully optimised that cost 1137 CPU seconds (one codegen unit,
# /usr/bin/time on a cold target directory). Unoptimised it cost 707, plus 326 for
# optimising the crate under test again, on a loaded machine; its executions ran at
# about a seventh of the optimised rate. CI's budget is time, and it starts this build
# first. `run` gets the same flags, or it would build again. LOCALVOL_FUZZ_RELEASE=1
# builds fully optimised, for long runs (soak mode).
if [ "${LOCALVOL_FUZZ_RELEASE:-0}" = 1 ]; then
  build_flags=(--sanitizer none --codegen-units 16)
else
  build_flags=(--dev --sanitizer none)
fi
build_start=$SECONDS
cargo fuzz build "${build_flags[@]}"
# The build's CPU time: `times` sums the children this shell waited for (cargo, rustc);
# to a file, since in a pipe or $(...) it would run in a subshell that has no children.
times_out=$(mktemp)
times >"$times_out"
cpu=$(tail -n 1 "$times_out" | awk '{print $1 " user, " $2 " system"}')
rm -f "$times_out"
echo "fuzz/run.sh: built $(echo "$targets" | wc -w) targets in $((SECONDS - build_start))s (CPU: $cpu)"
[ "$seconds" != --build-only ] || exit 0
total=0
for target in $targets; do
  mkdir -p "fuzz/corpus/$target"
  cp -n fuzz/seeds/"$target"/* "fuzz/corpus/$target/" 2>/dev/null || true
  # The parsers of tool output start from the real captures the unit tests use.
  case $target in
    lvm_report) cp -n tests/fixtures/lvm/*.json "fuzz/corpus/$target/" ;;
    ndctl_json) cp -n tests/fixtures/ndctl/*.json "fuzz/corpus/$target/" ;;
  esac
  log=$(mktemp)
  if ! cargo fuzz run "${build_flags[@]}" "$target" "fuzz/corpus/$target" -- \
      -max_total_time="$seconds" -print_final_stats=1 -max_len=8192 >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz/run.sh: $target FAILED (input saved under fuzz/artifacts/$target)" >&2
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rm -f "$log"
  printf '%-20s %12s executions in %ss, no crash\n' "$target" "$runs" "$seconds"
  total=$((total + runs))
done
echo "fuzz/run.sh: $total executions in total, no crash"
