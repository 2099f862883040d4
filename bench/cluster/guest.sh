#!/usr/bin/env bash
# bench/cluster/guest.sh [--quick]: pod start per class under a real kubelet in the
# tests/vm guest (root): tests/vm/cluster.sh boots the guest's node with the
# all-classes configuration (loop, lvm, lvm-thin, pmem direct, pmem lvm in one
# deployment, release build) and runs bench/cluster/guest-scenario.sh: one pod at a
# time with a new claim of each class, or an emptyDir, interleaved. Writes
# target/bench/guest-pod-start.{json,md} and prints the table. Issue 32's target: each
# class within 1.2x of the loop class's pod start. About 25 minutes under TCG (5 rounds);
# --quick (3 rounds) about 17.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
rounds=5
for arg in "$@"; do
  case $arg in
    --quick) rounds=3 ;;
    *) echo "usage: bench/cluster/guest.sh [--quick]" >&2; exit 2 ;;
  esac
done
target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked --bin localvol
rm -f "$target/bench/guest-pod-start.md" "$target/bench/guest-pod-start.json"
LOCALVOL_CLUSTER_BINARY=$target/release/localvol \
LOCALVOL_CLUSTER_EXTRA=bench/cluster/guest-scenario.sh \
LOCALVOL_BENCH_ROUNDS=$rounds LOCALVOL_SELECT='guest_cluster.udev_classes=' \
  tests/vm/cluster.sh --classes all-classes bench_pod_start
cat "$target/bench/guest-pod-start.md"
