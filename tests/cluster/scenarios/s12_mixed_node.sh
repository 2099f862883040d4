# shellcheck shell=bash  # sourced, never run
# Scenario 12 (the guest's "mixed" run): a configuration with a loop, a pmem and an lvm
# class on a node without the lvm class's volume group; the missing class is reported
# and served once its volume group is made (from VG_DISK). The scenario is Rust:
# tests/scenarios/mixed_node.rs.
s12_mixed_node() { rust_scenario s12_mixed_node; }   # lib.sh
