# shellcheck shell=bash  # sourced, never run
# Scenario 15: a volume's storage failing under a running pod, seen under the real
# kubelet (a Warning on the claim, kubelet's and localvol's volume health metrics).
# The scenario is Rust: tests/scenarios/volume_health.rs; this builds and runs it with
# the run's facts in its environment.
s15_volume_health() {
  local bin
  bin=$(cd "$REPO" && cargo test --locked --no-run --test scenarios --message-format=json 2>/dev/null |
    grep '"name":"scenarios"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
  [ -x "$bin" ] || fail "cannot build tests/scenarios"
  local out rc=0
  out=$(SC=$SC DEVICE_CLASS=$DEVICE_CLASS CLASS_KIND=$CLASS_KIND FS_SIZE=$FS_SIZE NODE_NAME=$NODE \
    LOOP_DIR=$LOOP_DIR "$bin" --ignored --exact s15_volume_health --nocapture 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v '^$' | tail -n 30
  [ "$rc" = 0 ] || fail "tests/scenarios s15_volume_health failed (exit $rc)"
  # A filter that matched nothing passes too: the one test must have run.
  grep -q '^test result: ok. 1 passed' <<<"$out" || fail "tests/scenarios did not run s15_volume_health"
}
