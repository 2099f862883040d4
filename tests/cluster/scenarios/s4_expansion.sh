# shellcheck shell=bash  # sourced, never run
# Scenario 4: online expansion of a mounted claim by localvol's --node-resizer, then by
# a central csi-resizer Deployment; on pmem direct, localvol's refusal. The scenario is
# Rust: tests/scenarios/expansion.rs. Its facts: S4_FSTYPE, the filesystem it grows (xfs
# by default: root lacks CAP_SYS_RESOURCE here, which resize2fs needs on a mounted ext4;
# tests/vm/cluster-guest.sh sets each class's own), and S4_CENTRAL_OVERLAY, the central
# csi-resizer's overlay (set but empty: none, that half left out).
s4_expansion() {
  rust_scenario s4_expansion S4_FSTYPE="${S4_FSTYPE:-xfs}" \
    S4_CENTRAL_OVERLAY="${S4_CENTRAL_OVERLAY-$HERE/overlays/central-resizer}"   # lib.sh
}
