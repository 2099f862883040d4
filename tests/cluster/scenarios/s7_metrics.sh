# shellcheck shell=bash  # sourced, never run
# Scenario 7: the daemon's /metrics counts the calls kubelet and the provisioner made
# for a pod's volume. The scenario is Rust: tests/scenarios/metrics.rs.
s7_metrics() { rust_scenario s7_metrics; }   # lib.sh
