# shellcheck shell=bash  # sourced, never run
# Scenario 1: the DaemonSet is Ready and kubelet has registered localvol (CSINode lists
# it with its topology key), by the registration this run deploys; on the loop class
# the other registration's overlay too, and back. The scenario is Rust:
# tests/scenarios/registration.rs.
s1_registration() { rust_scenario s1_registration; }   # lib.sh
