#!/usr/bin/env bash
# bench/cluster/run.sh [--quick]: the real-node benchmark (root). Starts the single-node
# cluster of tests/cluster (the kube-kit), deploys localvol from deploy/ (release build)
# and csi-driver-host-path as the peer (bench/cluster/peer), and runs benches/cluster:
# pod start against the peer and an emptyDir floor, bursts of 10/50/100 pods, and a
# daemon restart with 500 volumes. Writes target/bench/cluster.json and .md, and prints
# the tables; the daemon's logs and kubelet's go to target/bench/cluster-logs. Leaves
# nothing else behind (tests/cluster/run.sh's cleanup). About 20 minutes;
# --quick (3 rounds, a burst of 10, 20 volumes) about 3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
args=()
for arg in "$@"; do
  case $arg in
    --quick) args+=(--quick) ;;
    *) echo "usage: bench/cluster/run.sh [--quick]" >&2; exit 2 ;;
  esac
done
target=${CARGO_TARGET_DIR:-target}
cargo build --release --locked --bin localvol
# The client only waits on the cluster: a debug build, without fat LTO.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo build --locked --bench cluster --message-format=json-render-diagnostics >"$log"
exe=$(grep -o '"executable":"[^"]*cluster-[^"]*"' "$log" | tail -n 1 | sed 's/.*:"\(.*\)"/\1/')
[ -x "$exe" ] || { echo "bench/cluster/run.sh: no cluster bench executable" >&2; exit 1; }
rm -f "$target/bench/cluster.md"
# The daemon's logs (debug for its syscalls, commands and record writes) and kubelet's.
logs=$(realpath -m "$target/bench/cluster-logs")
rm -rf "$logs" && mkdir -p "$logs"
LOCALVOL_CLUSTER_BINARY=$target/release/localvol \
LOCALVOL_CLUSTER_MAX_PODS=130 \
LOCALVOL_CLUSTER_EXTRA=bench/cluster/scenario.sh \
LOCALVOL_CLUSTER_AUDIT_USERS=system:serviceaccount:localvol-bench-peer:hostpath-peer \
LOCALVOL_BENCH_CLUSTER_EXE=$exe LOCALVOL_BENCH_ARGS="${args[*]}" LOCALVOL_BENCH_LOG_DIR=$logs \
  tests/cluster/run.sh bench_cluster
cat "$target/bench/cluster.md"
