# shellcheck shell=bash  # sourced, never run
# Scenario 15: a volume's storage failing under a running pod, seen under the real
# kubelet (a Warning on the claim, kubelet's and localvol's volume health metrics).
# The scenario is Rust: tests/scenarios/volume_health.rs.
s15_volume_health() { rust_scenario s15_volume_health; }   # lib.sh
