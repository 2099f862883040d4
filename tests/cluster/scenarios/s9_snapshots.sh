# shellcheck shell=bash  # sourced, never run
# Scenario 9: VolumeSnapshots, restores and clones of a claim a running pod writes to,
# and pre-provisioned contents (Retain, Delete, one the daemon labels), with the
# csi-snapshotter node sidecar and the snapshot-controller run.sh (or the guest's
# cluster.sh) started; on the loop class the snapshots overlay and back. The scenario
# is Rust: tests/scenarios/snapshots.rs.
s9_snapshots() { rust_scenario s9_snapshots; }   # lib.sh
