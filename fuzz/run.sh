#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 30) each and prints the executions.
# Usage: fuzz/run.sh [SECONDS | --build-only]. Stable Rust and cargo only: the targets are
# libFuzzer binaries (libfuzzer-sys), built with the coverage instrumentation libFuzzer
# reads, as cargo-fuzz builds them, without cargo-fuzz itself (CI would first compile it,
# about 100 s of CPU on a 2-core machine, to pass a few flags).
# A crash fails the run; the input is left in fuzz/artifacts/TARGET/ to reproduce with
#   fuzz/target/x86_64-unknown-linux-gnu/debug/TARGET fuzz/artifacts/TARGET/crash-...
# (release/ after LOCALVOL_FUZZ_RELEASE=1).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
# Instrumented builds must not share (and rebuild) the main target directory.
export CARGO_TARGET_DIR=${LOCALVOL_FUZZ_TARGET_DIR:-$PWD/fuzz/target}

# The targets: the [[bin]]s of fuzz/Cargo.toml.
targets=$(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' fuzz/Cargo.toml)
[ -n "$targets" ] || { echo "fuzz/run.sh: no [[bin]] targets in fuzz/Cargo.toml" >&2; exit 1; }

# SanitizerCoverage as libFuzzer needs it, the flags cargo-fuzz passes: inline 8-bit
# edge counters with their PC table, comparison tracing (libFuzzer's value profile and
# its dictionary of compared bytes), the stack depth, no folded branches; `cfg(fuzzing)`
# for code that wants to know. Debug assertions on (overflow checks catch size
# arithmetic bugs); no sanitizer: the code under test is safe Rust. --target keeps these
# flags off build scripts and proc macros, which run on the host. (Instrumenting only
# the crates under test, through a rustc wrapper, saved no build time: 8m31s of CPU
# either way. The dependencies' unoptimised code is the cost, not its instrumentation.)
triple=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4
  -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table
  -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth
  -Cllvm-args=-simplifycfg-branch-fold-threshold=0 --cfg fuzzing -Cdebug-assertions"
export RUSTFLAGS=${RUSTFLAGS//$'\n  '/ }
# A dev build whose code under test is optimised (fuzz/Cargo.toml): every dependency of
# the crate is compiled with the coverage instrumentation, and fully optimised that cost
# 1137 CPU seconds (one codegen unit, /usr/bin/time on a cold target directory).
# Unoptimised it cost 707, plus 326 for optimising the crate under test again, on a
# loaded machine; its executions ran at about a seventh of the optimised rate. CI's
# budget is time, and it starts this build first. LOCALVOL_FUZZ_RELEASE=1 builds fully
# optimised, for long runs (soak mode).
if [ "${LOCALVOL_FUZZ_RELEASE:-0}" = 1 ]; then
  profile=release build_flags=(--release --config 'profile.release.debug="line-tables-only"')
  RUSTFLAGS+=" -Ccodegen-units=16"
else
  profile=debug build_flags=()
fi
build_start=$SECONDS
cargo build --locked --manifest-path fuzz/Cargo.toml --target "$triple" --bins "${build_flags[@]}"
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
  mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
  cp -n fuzz/seeds/"$target"/* "fuzz/corpus/$target/" 2>/dev/null || true
  # The parsers of tool output start from the real captures the unit tests use.
  case $target in
    lvm_report) cp -n tests/fixtures/lvm/*.json "fuzz/corpus/$target/" ;;
    ndctl_json) cp -n tests/fixtures/ndctl/*.json "fuzz/corpus/$target/" ;;
  esac
  log=$(mktemp)
  if ! "$CARGO_TARGET_DIR/$triple/$profile/$target" -artifact_prefix="fuzz/artifacts/$target/" \
      -max_total_time="$seconds" -print_final_stats=1 -max_len=8192 "fuzz/corpus/$target" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz/run.sh: $target FAILED (input saved under fuzz/artifacts/$target)" >&2
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rm -f "$log"
  [ "$runs" -gt 0 ] || { echo "fuzz/run.sh: $target ran no input" >&2; exit 1; }
  printf '%-20s %12s executions in %ss, no crash\n' "$target" "$runs" "$seconds"
  total=$((total + runs))
done
echo "fuzz/run.sh: $total executions in total, no crash"
