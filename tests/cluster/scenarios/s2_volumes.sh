# shellcheck shell=bash  # sourced, never run
# Scenario 2: WaitForFirstConsumer claims of the class's filesystem, of the other of ext4
# and xfs and of raw block, side by side, through their whole lifecycle; on loop also an
# Immediate class's. The scenario is Rust: tests/scenarios/volumes.rs.
s2_volumes() { rust_scenario s2_volumes; }   # lib.sh
