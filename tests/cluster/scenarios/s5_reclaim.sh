# shellcheck shell=bash  # sourced, never run
# Scenario 5: ReclaimSpace on a claim's schedule and on demand (`localvol reclaim` in the
# daemon pod), the freed space back on the node. The scenario is Rust:
# tests/scenarios/reclaim.rs.
s5_reclaim() { rust_scenario s5_reclaim; }   # lib.sh
