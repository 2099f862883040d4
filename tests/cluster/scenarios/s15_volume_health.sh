# shellcheck shell=bash  # sourced, never run
# Scenario 15: a volume's storage failing under a running pod (a loop image deleted; a
# thin pool filled by the pod's writes), seen under the real kubelet (a Warning on the
# claim, kubelet's and localvol's volume health metrics; the Node's event for a pool).
# The scenario is Rust: tests/scenarios/volume_health.rs.
s15_volume_health() { rust_scenario s15_volume_health; }   # lib.sh
