# shellcheck shell=bash  # sourced, never run
# Scenario 15: a volume's storage failing under a running pod, seen under the real
# kubelet (a Warning on the claim, kubelet's and localvol's volume health metrics).
# The scenario is Rust: tests/scenarios/volume_health.rs; this builds and runs it with
# the run's facts in its environment.
s15_volume_health() {
  ignored_test scenarios s15_volume_health SC="$SC" DEVICE_CLASS="$DEVICE_CLASS" \
    CLASS_KIND="$CLASS_KIND" FS_SIZE="$FS_SIZE" NODE_NAME="$NODE" LOOP_DIR="$LOOP_DIR"   # lib.sh
}
