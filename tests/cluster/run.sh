#!/usr/bin/env bash
# tests/cluster/run.sh - localvol on a real single-node Kubernetes cluster (kubelet,
# containerd, the real CSI sidecars), deployed from deploy/ through a test overlay.
#
#   tests/cluster/run.sh [SCENARIO...]       (root; scenarios: numbers or names; by default
#                                             tests/plan.yaml's host_cluster.scenarios)
#
# Needs the kube-kit at ../shared/kube-kit next to the repository (or KUBE_KIT=DIR) and
# the apt mirror for the image's root filesystem (cached in /var/cache/localvol-image).
# LOCALVOL_CLUSTER_REGISTRATION=builtin (default: the shipped loop overlay) or sidecar
# (the loop-registrar overlay). Leaves nothing behind: the node is stopped with
# `stop-node.sh --purge`, and the run fails if a mount or loop device of it is left.
# Logs are kept in a /tmp directory (printed) only when something failed.
#
# For bench/cluster/run.sh (not set by the tests): LOCALVOL_CLUSTER_BINARY (a built
# localvol for the image instead of the debug build), LOCALVOL_CLUSTER_MAX_PODS
# (kubelet's maxPods instead of the kit's 50), LOCALVOL_CLUSTER_EXTRA (a file of more
# scenario functions, selectable by name) and LOCALVOL_CLUSTER_AUDIT_USERS (more
# service accounts in the audit log).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
KIT=${KUBE_KIT:-$REPO/../shared/kube-kit}
HERE=$REPO/tests/cluster
export KUBE_KIT_BIN=${KUBE_KIT_BIN:-/var/cache/kube-kit/bin}
export KUBE_KIT_STATE=${KUBE_KIT_STATE:-/var/lib/kube-kit}
export KUBE_KIT_CRI_SOCK=${KUBE_KIT_CRI_SOCK:-/run/containerd/containerd.sock}
export KUBECONFIG=$KUBE_KIT_STATE/kubeconfig
export PATH=$KUBE_KIT_BIN:$PATH
IMAGE_CACHE=/var/cache/localvol-image
REGISTRATION=${LOCALVOL_CLUSTER_REGISTRATION:-builtin}
case $REGISTRATION in
  builtin) OVERLAY=$HERE/overlays/builtin ;;
  sidecar) OVERLAY=$HERE/overlays/registrar ;;
  *) echo "LOCALVOL_CLUSTER_REGISTRATION must be builtin or sidecar" >&2; exit 2 ;;
esac
source "$HERE/lib.sh"
# shellcheck source=/dev/null  # every scenario file, by a glob
for f in "$HERE"/scenarios/*.sh; do source "$f"; done
# EXTRA_SCENARIOS and ALL are select_scenarios's (lib.sh).
# shellcheck disable=SC2034
EXTRA_SCENARIOS=()
# shellcheck source=/dev/null  # a file of more scenarios, named by the caller
if [ -n "${LOCALVOL_CLUSTER_EXTRA:-}" ]; then source "$LOCALVOL_CLUSTER_EXTRA"; fi   # sets EXTRA_SCENARIOS

# shellcheck source=tests/plan/plan.sh
source "$REPO/tests/plan/plan.sh"
plan_words ALL get host_cluster.scenarios
selected=()   # select_scenarios (lib.sh) fills it
select_scenarios "$@"

[ "$(id -u)" = 0 ] || { echo "tests/cluster/run.sh: run as root" >&2; exit 1; }
[ -x "$KIT/install.sh" ] || { echo "tests/cluster/run.sh: no kube-kit at $KIT" >&2; exit 1; }
# One node per machine (fixed ports, containerd, kubelet's root): a second run waits.
exec 9>/run/localvol-cluster.lock
flock -n 9 || { echo "tests/cluster/run.sh: waiting for another cluster run to finish"; flock 9; }

LOGS=$(mktemp -d /tmp/localvol-cluster.XXXXXX)
# A copy of the kit's recipe whose kubelet has the CSIVolumeHealth gate on (lib.sh), and
# another maxPods if one is asked for.
cp -r "$KIT/recipe" "$LOGS/recipe"
RECIPE=$LOGS/recipe
volume_health_gate "$RECIPE" || exit 1
if [ -n "${LOCALVOL_CLUSTER_MAX_PODS:-}" ]; then
  sed -i "s/^maxPods: .*/maxPods: $LOCALVOL_CLUSTER_MAX_PODS/" "$RECIPE/kubelet-config.yaml.in"
  grep -qx "maxPods: $LOCALVOL_CLUSTER_MAX_PODS" "$RECIPE/kubelet-config.yaml.in" ||
    { echo "kit's kubelet config has no maxPods line" >&2; exit 1; }
fi
T0=$SECONDS
phase() { printf '==== cluster: %s (%ss)\n' "$1" "$((SECONDS - T0))"; }
failed=0
SNAPSHOT_CONTROLLER_PID=""   # scenario 9's, started below
created_data_dir=0
[ -e "$HOST_DATA_DIR" ] || created_data_dir=1

# Mounts and loop devices this run could have made: anything under kubelet's root or
# localvol's data dir. They must not exist before (another run's leftovers would make
# the checks lie) and must not exist after.
leftovers() {
  awk '$5 ~ "^/var/lib/(kubelet|localvol)(/|$)" {print "mount " $5}' /proc/self/mountinfo
  # The daemon attaches inside its container, so losetup may show the backing file
  # relative to its filesystem (/loop/pvc-....img): match the class directory's name too.
  losetup -a -O NAME,BACK-FILE -n 2>/dev/null |
    awk '$2 ~ "^(/var/lib/localvol)?/loop/pvc-" {print "loop " $1 " " $2}'
}

cleanup() {
  local rc=$?
  # A signal's `exit 130` would end the cleanup at its next command: the signal that
  # brought us here is handled, and another one waits until the cleanup is done.
  trap '' INT TERM
  set +e
  phase "cleanup"
  if kubectl get --raw /readyz >/dev/null 2>&1; then
    kubectl -n "$SYSTEM_NS" logs ds/localvol-node -c localvol --tail=-1 >"$LOGS/localvol.log" 2>&1
    kubectl -n "$SYSTEM_NS" logs ds/localvol-node -c localvol --previous --tail=-1 >"$LOGS/localvol-previous.log" 2>&1
    kubectl get events -A >"$LOGS/events.txt" 2>&1
    # A CI keeps the output, not $LOGS: a failure's evidence goes there too.
    if [ $failed != 0 ]; then
      echo "---- the daemon's last 30 log lines"; tail -n 30 "$LOGS/localvol.log"
      echo "---- warning events"; grep -v ' Normal ' "$LOGS/events.txt" | tail -n 20
    fi
    # The driver itself unmounts and deletes the test volumes while it still runs.
    for ns in $(kubectl get ns -o name | sed -n 's|^namespace/\(lvtest-.*\)|\1|p'); do
      kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1
    done
    local end=$((SECONDS + 90))
    # (No VolumeSnapshotContent either: deleting one needs the snapshot-controller.)
    while [ $SECONDS -lt $end ] && { kubectl get ns -o name | grep -q lvtest- || [ -n "$(kubectl get pv -o name)" ] ||
      [ -n "$(kubectl get volumesnapshotcontent -o name 2>/dev/null)" ]; }; do sleep 1; done
    kubectl get pv -o name | grep -q . && echo "cleanup: volumes left: $(kubectl get pv -o name)"
    kubectl get volumesnapshotcontent -o name 2>/dev/null | grep -q . &&
      echo "cleanup: snapshot contents left: $(kubectl get volumesnapshotcontent -o name)"
    kubectl delete -k "$OVERLAY" --wait=false >/dev/null 2>&1
  fi
  [ -n "$SNAPSHOT_CONTROLLER_PID" ] && { kill "$SNAPSHOT_CONTROLLER_PID"; wait "$SNAPSHOT_CONTROLLER_PID"; }
  cp "$KUBE_KIT_STATE"/logs/*.log "$LOGS/" 2>/dev/null
  "$RECIPE/stop-node.sh" --purge >"$LOGS/stop-node.log" 2>&1 || { echo "cleanup: stop-node.sh --purge failed (see $LOGS/stop-node.log)"; rc=1; }
  local left; left=$(leftovers)
  if [ -n "$left" ]; then
    echo "cleanup: FAIL, left on the host:"; echo "$left"; rc=1
    # Remove them anyway, so that the next run starts clean.
    awk '$1 == "mount" {print $2}' <<<"$left" | sort -r | xargs -r -n1 umount -l
    awk '$1 == "loop" {print $2}' <<<"$left" | xargs -r -n1 losetup -d
  fi
  # Any file left is a volume's or a snapshot's (image, record); the daemon's own
  # empty directories (snapshots/) are not.
  if [ -d "$LOOP_DIR" ] && [ -n "$(find "$LOOP_DIR" -mindepth 1 ! -type d -print -quit)" ]; then
    echo "cleanup: FAIL, files left in $LOOP_DIR:"; find "$LOOP_DIR" -mindepth 1 -ls; rc=1
  fi
  [ $created_data_dir = 1 ] && rm -rf --one-file-system "$HOST_DATA_DIR"
  [ -n "${WORK:-}" ] && rm -rf "$WORK"
  if [ $rc = 0 ] && [ $failed = 0 ]; then rm -rf "$LOGS"; else echo "cluster: logs kept in $LOGS"; fi
  phase "done"
  [ $failed = 0 ] || rc=1
  exit $rc
}

left=$(leftovers)
[ -z "$left" ] || { echo "tests/cluster/run.sh: the host has mounts or loop devices of an earlier run:"; echo "$left"; exit 1; }
trap cleanup EXIT
trap 'exit 130' INT TERM

phase "kit and binary"
"$KIT/install.sh" /var/cache/kube-kit >"$LOGS/install.log"
BINARY=${LOCALVOL_CLUSTER_BINARY:-${CARGO_TARGET_DIR:-target}/debug/localvol}
if [ -z "${LOCALVOL_CLUSTER_BINARY:-}" ]; then
  cargo build --locked --bin localvol 2>"$LOGS/cargo.log" || { cat "$LOGS/cargo.log"; exit 1; }
fi
[ -x "$BINARY" ] || { echo "tests/cluster/run.sh: no localvol binary at $BINARY" >&2; exit 1; }

# The runtime stage's root filesystem (lib.sh, cached in $IMAGE_CACHE).
rootfs=$(image_rootfs "$IMAGE_CACHE" "$LOGS")

# The node's Debian packages, before the control plane: start-kube.sh needs etcd, and
# only start-node.sh (run after it) would install it.
install_node_packages "$LOGS"

phase "node"
# The control plane first, with an audit log of the daemon pod's requests (scenario 8
# counts them): start-node.sh then finds it running. The kubelet client flags are the
# ones start-node.sh would pass.
AUDIT_LOG=$KUBE_KIT_STATE/logs/localvol-audit.log
mkdir -p "$KUBE_KIT_STATE/logs"
audit_users='"system:serviceaccount:localvol-system:localvol-node"'
for user in ${LOCALVOL_CLUSTER_AUDIT_USERS:-}; do audit_users+=", \"$user\""; done
cat >"$LOGS/audit-policy.yaml" <<YAML
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: [$audit_users]
  - level: None
YAML
"$RECIPE/start-kube.sh" --kcm -- \
  --kubelet-client-certificate="$KUBE_KIT_STATE/pki/admin.crt" --kubelet-client-key="$KUBE_KIT_STATE/pki/admin.key" \
  --kubelet-preferred-address-types=InternalIP,Hostname \
  --audit-policy-file="$LOGS/audit-policy.yaml" --audit-log-path="$AUDIT_LOG" --audit-log-format=json \
  --audit-log-mode=batch --audit-log-batch-max-wait=1s >"$LOGS/start-kube.log" 2>&1 ||
  { tail -20 "$LOGS/start-kube.log"; exit 1; }
netns_dir_shared   # lib.sh: before the node's first pod
"$RECIPE/start-node.sh" >"$LOGS/start-node.log" 2>&1 || { tail -20 "$LOGS/start-node.log"; exit 1; }

phase "images"
WORK=$(mktemp -d /tmp/localvol-cluster-images.XXXXXX)
build_image_archives "$WORK" "$BINARY" "$rootfs" "$RECIPE"   # lib.sh
for tar in "$WORK"/*.tar; do
  ctr --address "$KUBE_KIT_CRI_SOCK" -n k8s.io images import "$tar" >/dev/null
done
rm -rf "$WORK"; WORK=""
# The manifests must name exactly the images imported here.
imported=$(ctr --address "$KUBE_KIT_CRI_SOCK" -n k8s.io images ls -q)
for img in $(kubectl kustomize "$HERE/overlays/central-resizer" | sed -n 's/^ *image: //p') \
           $(kubectl kustomize "$HERE/overlays/registrar" | sed -n 's/^ *image: //p') \
           $(kubectl kustomize "$HERE/overlays/snapshots" | sed -n 's/^ *image: //p'); do
  grep -qx "$img" <<<"$imported" ||
    { echo "image $img of the manifests was not imported" >&2; exit 1; }
done

phase "deploy ($REGISTRATION registration: ${OVERLAY#"$REPO"/})"
# Scheduled reclaim at once (scenario 5): csi-addons' own ConfigMap turns the stagger off.
kubectl create namespace csi-addons-system >/dev/null
kubectl -n csi-addons-system create configmap csi-addons-config --from-literal=cronjob-stagger-window=0 >/dev/null
kubectl apply -k "$OVERLAY" >"$LOGS/apply.log"
wait_until 120 "DaemonSet localvol-node Ready" daemon_ready

# Scenarios 9 and 11: the VolumeSnapshot CRDs and snapshot-controller; scenario 14's
# dry run of the chart with snapshots (a VolumeSnapshotClass) needs the CRDs.
if [[ " ${selected[*]} " == *" s9_snapshots "* || " ${selected[*]} " == *" s11_e2e_storage "* || " ${selected[*]} " == *" s14_helm "* ]]; then
  phase "snapshot CRDs and snapshot-controller"
  start_snapshot_controller "$KIT/recipe" "$LOGS"   # lib.sh
fi

phase "scenarios"
results=()
for s in "${selected[@]}"; do
  start=$SECONDS
  set +e
  ( set -e; "$s" ) >"$LOGS/$s.log" 2>&1
  rc=$?
  set -e
  took=$((SECONDS - start))
  if [ $rc = 0 ]; then
    results+=("PASS $s ${took}s")
    sed -n 's/^  \[[0-9:]*\] NOTE /    /p' "$LOGS/$s.log"
  else
    results+=("FAIL $s ${took}s")
    failed=1
    echo "---- $s failed; its log:"; sed 's/^/    /' "$LOGS/$s.log" | tail -40
  fi
  printf '%s\n' "${results[-1]}"
done

echo
echo "cluster results ($REGISTRATION registration):"
printf '  %s\n' "${results[@]}"
