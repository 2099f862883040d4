#!/usr/bin/env bash
# tests/vm/cluster-guest.sh - the guest side of tests/vm/cluster.sh (run by it through
# tests/vm/run.sh, never by hand): a kube-kit node in this QEMU guest, localvol deployed
# from a shipped overlay per device class, tests/cluster's scenarios on that class.
#
#   cluster-guest.sh RUN_DIR CLASSES SCENARIO...
#
# RUN_DIR (shared with the host; tests/vm/cluster.sh makes it) holds the kubectl relay's
# directory kubectl-relay (the harness's kubectl runs on the host, as the control plane
# does), the control plane's kube-kit state control-plane (its PKI and kubeconfig), and
# tap-addresses: the host's and this guest's addresses on the tap device.
# /var/cache/localvol-vm/cluster-modules-KVER (made by cluster.sh) is the guest kernel's
# whole module tree: the bridge, veth, netfilter and dummy modules the node needs are not
# in run.sh's.
# Disks: /dev/vda for guest-prep.sh (the node's state, kubelet's root); /dev/vdb for the
# volume group `localvol` of the lvm classes (the name deploy/overlays/lvm*/config.yaml
# expects); /dev/vdc the node's containerd root, localvol's and the sidecars' images
# imported (made on the host); the NVDIMM's region0 for the pmem classes
# (deploy/overlays/pmem/config.yaml; for pmem-lvm, deploy/overlays/pmem-lvm/config.yaml's
# VG `localvol-pmem` on its one fsdax namespace), labelled here as new hardware would be.
# Writes RUN_DIR/results ("PASS|FAIL|SKIP SCENARIO CLASS SECONDS" lines, then
# "PASS|FAIL final-state") and RUN_DIR/logs/.
# Exits 0 only if no line is a FAIL.
set -uo pipefail
RUN=${1:?usage: cluster-guest.sh RUN_DIR CLASSES SCENARIO...}
IFS=, read -r -a CLASSES <<<"${2:?classes}"
shift 2
SCENARIOS=("$@")
[ "${VMTEST_GUEST:-0}" = 1 ] || { echo "cluster-guest.sh: runs inside the guest only (it formats /dev/vda, /dev/vdb)" >&2; exit 2; }
cd "$(dirname "$0")/../.."
REPO=$PWD
KIT=${KUBE_KIT:-$REPO/../shared/kube-kit}
HERE=$REPO/tests/cluster
LOGS=$RUN/logs
mkdir -p "$LOGS"
RESULTS=$RUN/results
: >"$RESULTS"
VG_DISK=/dev/vdb
export KUBE_KIT_STATE=/var/lib/kube-kit-vm/state
export KUBE_KIT_BIN=${KUBE_KIT_BIN:-/var/cache/kube-kit/bin}
export KUBE_KIT_CRI_SOCK=/run/containerd/containerd.sock
export KUBECONFIG=$KUBE_KIT_STATE/kubeconfig
export PATH=$KUBE_KIT_BIN:$PATH
export WAIT_SCALE=${WAIT_SCALE:-3}   # lib.sh's wait_until limits, under TCG
export POLL_INTERVAL=${POLL_INTERVAL:-1}   # and its polls (a kubectl call relayed to the host each)
# shellcheck disable=SC2034  # read by tests/cluster/lib.sh, sourced below
REGISTRATION=builtin
read -r UP0 _ </proc/uptime
T0=$SECONDS
phase() { read -r up _ </proc/uptime; printf '==== guest: %s (%ss since the command started, uptime %ss)\n' "$1" "$((SECONDS - T0))" "${up%.*}"; }
result() { echo "$*" >>"$RESULTS"; echo "RESULT $*"; }

# shellcheck source=tests/cluster/lib.sh
source "$HERE/lib.sh"
# Every scenario file, as run.sh sources them (a scenario may call another file's parts).
for f in "$HERE"/scenarios/*.sh; do
  # shellcheck disable=SC1090
  source "$f"
done
# More scenario functions (bench/cluster/guest.sh's), as run.sh takes them.
if [ -n "${LOCALVOL_CLUSTER_EXTRA:-}" ]; then
  # shellcheck disable=SC1090
  source "$REPO/$LOCALVOL_CLUSTER_EXTRA"
fi
# The harness's kubectl runs on the host, beside the API server.
# shellcheck source=tests/vm/kubectl-relay.sh
source "$REPO/tests/vm/kubectl-relay.sh"
relay_client "$RUN/kubectl-relay" || { echo "FATAL: no kubectl relay" >&2; exit 1; }
for s in "${SCENARIOS[@]}"; do
  declare -F "$s" >/dev/null || { echo "cluster-guest.sh: no scenario $s in $HERE/scenarios" >&2; exit 2; }
done

# ---------------------------------------------------------------- the node
phase "modules"
MODS=/var/cache/localvol-vm/cluster-modules-$(uname -r)
[ -f "$MODS/.complete" ] || { echo "FATAL: no $MODS (tests/vm/cluster.sh makes it)" >&2; exit 1; }
mount --bind "$MODS" "/lib/modules/$(uname -r)" || { echo "FATAL: cannot mount $MODS" >&2; exit 1; }
modprobe dm_thin_pool; modprobe dm_snapshot
# The control plane runs on the host (tests/vm/cluster.sh), reached over the tap device's
# virtio NIC. The kit's kubeconfigs, its certificate and the address pods are told to use
# are 127.0.0.1:6443: a forwarder here makes that the host's API server.
phase "network: the host's control plane"
CP_STATE=$RUN/control-plane
[ -f "$CP_STATE/kubeconfig" ] || { echo "FATAL: no control plane state in $CP_STATE (tests/vm/cluster.sh makes it)" >&2; exit 1; }
read -r TAP_HOST TAP_GUEST <"$RUN/tap-addresses" || { echo "FATAL: no $RUN/tap-addresses (tests/vm/cluster.sh writes it)" >&2; exit 1; }
modprobe virtio_net
nic=""
for _ in $(seq 100); do
  nic=$(ls /sys/bus/virtio/drivers/virtio_net/*/net 2>/dev/null | head -n 1)
  [ -n "$nic" ] && break; sleep 0.1
done
[ -n "$nic" ] || { echo "FATAL: no virtio NIC (run.sh --tap)" >&2; exit 1; }
ip addr add "$TAP_GUEST/24" dev "$nic" && ip link set "$nic" up &&
  ip route add default via "$TAP_HOST" dev "$nic" || { echo "FATAL: cannot address $nic" >&2; exit 1; }
socat TCP-LISTEN:6443,bind=127.0.0.1,fork,reuseaddr "TCP:$TAP_HOST:6443" 2>"$LOGS/api-forwarder.log" &
for _ in $(seq 100); do curl -sk -o /dev/null https://127.0.0.1:6443/healthz && break; sleep 0.2; done
curl -sk -o /dev/null https://127.0.0.1:6443/healthz || { echo "FATAL: the host's API server is not reachable from the guest" >&2; exit 1; }
phase "guest-prep.sh /dev/vda"
"$KIT/recipe/guest-prep.sh" /dev/vda >"$LOGS/guest-prep.log" 2>&1 || { cat "$LOGS/guest-prep.log"; exit 1; }
# This guest's / is the host's, read-only under an overlay, and the host's cluster suite
# may still run beside it (tests/all.sh): its node writes these directories on the host,
# and its cleanup (stop-node.sh --purge, run.sh) removes them, which took them from under
# this node too (CI: kubelet could no longer make /var/log/pods/POD once the host's run
# had ended, and no pod started). Emptying them through the overlay races the host's
# node writing them ("rm: cannot remove '/var/log/pods': Directory not empty", CI), so
# each is a directory of the scratch disk, mounted over the host's: this node's own.
OWN=$(dirname "$KUBE_KIT_STATE")/own
for d in /var/log/pods /var/log/containers /var/lib/localvol /usr/libexec/kubernetes; do
  mkdir -p "$OWN$d" "$d" && mount --bind "$OWN$d" "$d" ||
    { echo "FATAL: cannot make $d the guest's own" >&2; exit 1; }
done
# The node's containerd root with the images imported: /dev/vdc (tests/vm/cluster.sh).
mkdir -p "$KUBE_KIT_STATE/containerd/root" && mount /dev/vdc "$KUBE_KIT_STATE/containerd/root" ||
  { echo "FATAL: cannot mount the node's image store" >&2; exit 1; }
# The control plane's PKI and admin kubeconfig: start-node.sh makes the node's
# certificate with that CA.
cp -a "$CP_STATE/pki" "$CP_STATE/kubeconfig" "$KUBE_KIT_STATE/"
# The node's kubelet with its housekeeping at production rates, not the kit's quick
# ones (container stats every 10 s, pod resyncs every 10 s, node status every 5 s): under
# TCG an idle node with the lvm-thin overlay deployed spent 44 % of its two vCPUs, the
# kubelet a third of one. With these flags the kubelet's share of the idle node's CPU
# fell by about a tenth only (one 60 s window each, read from /proc in the guest): most
# of its idle work is loops no flag sets. The kit's binaries, and a kubelet that is the
# kit's with these flags (a flag overrides the kit's configuration file), in a
# directory of the guest's own.
GUEST_KIT_BIN=/run/localvol-kit-bin
mkdir -p "$GUEST_KIT_BIN"
ln -sf "$KUBE_KIT_BIN"/* "$GUEST_KIT_BIN/"   # one process: each costs ~0.1 s of CPU under TCG
rm "$GUEST_KIT_BIN/kubelet"
cat >"$GUEST_KIT_BIN/kubelet" <<KUBELET
#!/bin/sh
exec "$KUBE_KIT_BIN/kubelet" "\$@" --housekeeping-interval=60s \
  --max-housekeeping-interval=60s --sync-frequency=60s --node-status-update-frequency=10s
KUBELET
chmod 755 "$GUEST_KIT_BIN/kubelet"
# The node's OCI runtime: crun (Debian's, the same runtime-spec and CLI as runc), where
# the kit's containerd configuration names runc. runc, a Go program, starts itself again
# for every container it creates and every exec, from a copy of its binary in memory
# (its guard against CVE-2019-5736): under TCG each of those copies is new code to
# translate. A pod's sandbox, its container, each `kubectl exec` and their teardown run
# the runtime a dozen times. crun is C and forks instead. The kit's recipe is copied to
# a directory of the guest's own, its containerd template changed (start-node.sh renders
# the templates beside it); what localvol is tested against, the kubelet's CSI calls and
# the mounts in the pods, does not change with the runtime. Measured in
# tests/vm/README.md (Cost).
GUEST_RECIPE=/run/localvol-kit-recipe
rm -rf "$GUEST_RECIPE" && cp -a "$KIT/recipe" "$GUEST_RECIPE" &&
  sed -i 's|^\( *BinaryName = \)"/usr/sbin/runc"$|\1"/usr/bin/crun"|' "$GUEST_RECIPE/containerd.toml.in" &&
  grep -q 'BinaryName = "/usr/bin/crun"' "$GUEST_RECIPE/containerd.toml.in" ||
  { echo "FATAL: the kit's containerd template does not name /usr/sbin/runc as BinaryName" >&2; exit 1; }
volume_health_gate "$GUEST_RECIPE" || exit 1   # lib.sh: kubelet reads volume conditions
[ -x /usr/bin/crun ] || { echo "FATAL: no /usr/bin/crun (tests/cluster/lib.sh's NODE_PACKAGES)" >&2; exit 1; }
phase "start-node.sh --no-control-plane"
if ! KUBE_KIT_BIN=$GUEST_KIT_BIN "$GUEST_RECIPE/start-node.sh" --no-control-plane >"$LOGS/start-node.log" 2>&1; then
  tail -30 "$LOGS/start-node.log"
  cp "$KUBE_KIT_STATE"/logs/*.log "$LOGS/" 2>/dev/null
  exit 1
fi
grep -q '^ *BinaryName = "/usr/bin/crun"$' "$KUBE_KIT_STATE/etc/containerd.toml" ||
  { echo "FATAL: the node's containerd configuration does not run crun" >&2; exit 1; }
read -r up _ </proc/uptime
phase "node Ready"
echo "node-ready uptime=${up%.*}s command-start-uptime=${UP0%.*}s" >>"$RESULTS.times"
imported=$(ctr --address "$KUBE_KIT_CRI_SOCK" -n k8s.io images ls -q)
for c in "${CLASSES[@]}"; do
  for img in $(kubectl kustomize "$HERE/overlays/$c" | sed -n 's/^ *image: //p'); do
    grep -qx "$img" <<<"$imported" || { echo "FATAL: image $img of overlays/$c was not imported" >&2; exit 1; }
  done
done

# ---------------------------------------------------------------- per class
# The class's settings for lib.sh and the scenarios, as the shipped overlay defines them.
class_env() { # CLASS
  case $1 in
    lvm-thin) CLASS_KIND=lvm-thin DEVICE_CLASS=lvm-thin SC=localvol-lvm-thin FSTYPE=xfs
              FS_SIZE=320Mi ;;   # mkfs.xfs refuses below 300 MB (tests/vm/README.md)
    lvm) CLASS_KIND=lvm DEVICE_CLASS=lvm SC=localvol-lvm FSTYPE=ext4 FS_SIZE=64Mi ;;
    pmem) CLASS_KIND=pmem DEVICE_CLASS=pmem SC=localvol-pmem FSTYPE=ext4 FS_SIZE=64Mi ;;
    pmem-lvm) CLASS_KIND=pmem-lvm DEVICE_CLASS=pmem-lvm SC=localvol-pmem-lvm FSTYPE=ext4 FS_SIZE=64Mi ;;
    # tests/cluster/overlays/mixed: loop, pmem and lvm classes in one configuration;
    # scenario 12 sets the kind of each claim it makes.
    mixed) CLASS_KIND=loop DEVICE_CLASS=loop SC=localvol-mixed-loop FSTYPE=ext4 FS_SIZE=64Mi ;;
    # tests/cluster/overlays/all-classes: every kind of class in one configuration, for
    # bench/cluster/guest.sh's pod starts (its scenario names each class's StorageClass).
    all-classes) CLASS_KIND=loop DEVICE_CLASS=loop SC=localvol-all-loop FSTYPE=ext4 FS_SIZE=64Mi ;;
    *) echo "FATAL: class $1 not supported here" >&2; exit 2 ;;
  esac
  BLOCK_SIZE=32Mi OVERLAY=$HERE/overlays/$1
  # deploy/overlays/pmem-lvm/config.yaml's VG; deploy/overlays/lvm*/config.yaml's.
  if [ "$1" = pmem-lvm ]; then LVM_VG=localvol-pmem; else LVM_VG=localvol; fi
  # Scenario 4 grows the class's own fstype (ext4 grows online here: root has
  # CAP_SYS_RESOURCE in the guest) by --node-resizer, on every class that grows. Its half
  # with the central csi-resizer is left to the host suite: the sidecar reaches the same
  # ControllerExpandVolume and backend growth that --node-resizer runs here.
  # shellcheck disable=SC2034  # read by tests/cluster/scenarios/s4_expansion.sh
  S4_FSTYPE=$FSTYPE S4_CENTRAL_OVERLAY=
}
# Scenarios that do not apply to a class, or repeat what another class's run proves
# (issue 32: cut repetition, not coverage), and why: tests/plan.yaml's guest_cluster
# (not_for, class_runs_only, scenario_runs_only_on), asked once for every class and
# scenario of this run (a process start is dear in this guest). The binary is the
# host's (LOCALVOL_PLAN, from tests/vm/cluster.sh): this guest's / is the host's.
# shellcheck source=tests/plan/plan.sh
source "$REPO/tests/plan/plan.sh"
declare -A NOT_FOR=()
skips=$(IFS=,; plan skips "${CLASSES[*]}" "${SCENARIOS[@]}") || { echo "FATAL: cannot read tests/plan.yaml" >&2; exit 1; }
while IFS=$'\t' read -r s c why; do
  [ -z "$s" ] || NOT_FOR[$s:$c]=$why
done <<<"$skips"
not_for_class() { # SCENARIO CLASS: the reason it does not run there, or status 1
  [ -n "${NOT_FOR[$1:$2]+set}" ] || return 1
  echo "${NOT_FOR[$1:$2]}"
}

# A production host's udev for the plan's guest_cluster.udev_classes (issue 32): the
# udev package tests/vm/cluster.sh put in RUN_DIR/udev unpacked into this guest's
# overlay root, systemd-udevd running as on a host without systemd, every device
# triggered, and the lvm.conf Debian ships (udev_sync = 1, udev_rules = 1: the host's,
# which deploy/components/lvm-host mounts into the daemon's pod) instead of the one
# run.sh made for a guest without udev. The harness's own LVM commands wait for udev too
# (no DM_DISABLE_UDEV). udev_stop checks that udevd lived through the class and handled
# the events of its device-mapper devices (udevadm monitor: the events after udev's
# rules ran), and puts the guest's lvm.conf back.
UDEV_PID="" UDEV_MONITOR_PID=""
UDEV_CLASSES=$(plan get guest_cluster.udev_classes --sep ,) || { echo "FATAL: cannot read tests/plan.yaml" >&2; exit 1; }
udev_wanted() { [[ ",$UDEV_CLASSES," == *",$1,"* ]]; }
udev_start() {
  local deb
  # Unpacked over the merged /usr: the packages' ./bin and ./lib must not replace the
  # root's /bin and /lib symlinks.
  for deb in "$RUN"/udev/*.deb; do
    dpkg-deb --fsys-tarfile "$deb" | tar -x --keep-directory-symlink -C / || return 1
  done
  cp /etc/lvm/lvm.conf /run/lvm.conf.guest && cp "$RUN/udev/lvm.conf" /etc/lvm/lvm.conf || return 1
  [ "$(lvmconfig --type full activation/udev_sync activation/udev_rules | tr '\n' ' ')" = "udev_sync=1 udev_rules=1 " ] ||
    { echo "Debian's lvm.conf does not have udev_sync=1 udev_rules=1"; return 1; }
  /lib/systemd/systemd-udevd --daemon || return 1
  UDEV_PID=$(pgrep -x systemd-udevd | head -n 1)
  [ -n "$UDEV_PID" ] || return 1
  udevadm trigger --type=subsystems --action=add && udevadm trigger --type=devices --action=add &&
    udevadm settle --timeout=120 || return 1
  udevadm monitor --udev --subsystem-match=block >"$LOGS/udev-events-$CLASS.log" 2>&1 &
  UDEV_MONITOR_PID=$!
  unset DM_DISABLE_UDEV
  echo "systemd-udevd $(udevadm --version) running (pid $UDEV_PID); lvm.conf: Debian's, $(lvmconfig --type full activation/udev_sync activation/udev_rules | tr '\n' ' ')"
}
udev_stop() { # CLASS
  local ok=0 added removed events=$LOGS/udev-events-$1.log
  kill -0 "$UDEV_PID" 2>/dev/null && udevadm control --ping || { echo "udev: systemd-udevd did not live through the class"; ok=1; }
  kill "$UDEV_MONITOR_PID"; wait "$UDEV_MONITOR_PID" 2>/dev/null
  added=$(grep -cE '^UDEV .* add +/devices/virtual/block/dm-' "$events")
  removed=$(grep -cE '^UDEV .* remove +/devices/virtual/block/dm-' "$events")
  [ "$added" -gt 0 ] && [ "$removed" -gt 0 ] || { echo "udev: handled $added add and $removed remove events of device-mapper devices, expected some of each"; ok=1; }
  udevadm control --exit; wait_gone_pid "$UDEV_PID"
  cp /run/lvm.conf.guest /etc/lvm/lvm.conf
  export DM_DISABLE_UDEV=1
  echo "systemd-udevd ran through the class and handled $added add and $removed remove events of device-mapper devices"
  return $ok
}
wait_gone_pid() { local _i; for _i in $(seq 100); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill "$1"; }
# The storage each configuration expects on the node (the overlay's config.yaml), and
# what may be left of it, are the testkit's (localvol_testkit::guest::overlay), through
# its guest-storage binary (tests/vm/cluster.sh copies it into RUN_DIR).
storage() { "$RUN/guest-storage" "$@"; }

# Deletes the test namespaces (the driver still runs, so it unpublishes, unstages and
# deletes their volumes itself), then the deployment.
undeploy() {
  kubectl -n "$SYSTEM_NS" logs ds/localvol-node -c localvol --tail=-1 >"$LOGS/localvol-$CLASS.log" 2>&1
  kubectl -n "$SYSTEM_NS" logs ds/localvol-node -c localvol --previous --tail=-1 >"$LOGS/localvol-$CLASS-previous.log" 2>&1
  kubectl get events -A >"$LOGS/events-$CLASS.txt" 2>&1
  local ns
  for ns in $(kubectl get ns -o name | sed -n 's|^namespace/\(lvtest-.*\)|\1|p'); do
    kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1
  done
  local end=$((SECONDS + 300))
  test_objects_left() { local left; left=$(kubectl get ns -o name; kubectl get pv -o name); [[ $left == *lvtest-* || $left == *persistentvolume/* ]]; }
  while [ $SECONDS -lt $end ] && test_objects_left; do pause "$POLL_INTERVAL"; done
  local ok=0
  [ -z "$(kubectl get pv -o name)" ] || { echo "cleanup: volumes left: $(kubectl get pv -o name | tr '\n' ' ')"; ok=1; }
  kubectl delete -k "$OVERLAY" --wait=false >/dev/null 2>&1
  end=$((SECONDS + 300))
  while [ $SECONDS -lt $end ] && kubectl get ns "$SYSTEM_NS" >/dev/null 2>&1; do pause "$POLL_INTERVAL"; done
  kubectl get ns "$SYSTEM_NS" >/dev/null 2>&1 && { echo "cleanup: namespace $SYSTEM_NS not deleted"; ok=1; }
  return $ok
}


failed=0
for CLASS in "${CLASSES[@]}"; do
  class_env "$CLASS"
  export CLASS_KIND DEVICE_CLASS SC FSTYPE FS_SIZE BLOCK_SIZE LVM_VG OVERLAY
  start=$SECONDS
  if udev_wanted "$CLASS"; then
    phase "class $CLASS: udev"
    if ! udev_start >"$LOGS/udev-$CLASS.log" 2>&1; then
      cat "$LOGS/udev-$CLASS.log"; result "FAIL deploy $CLASS $((SECONDS - start))s (udev)"; failed=1; continue
    fi
    tail -n 1 "$LOGS/udev-$CLASS.log"
  fi
  phase "class $CLASS: storage"
  if ! storage overlay make "$CLASS" "$VG_DISK" >"$LOGS/storage-$CLASS.log" 2>&1; then
    cat "$LOGS/storage-$CLASS.log"; result "FAIL deploy $CLASS $((SECONDS - start))s (storage)"; failed=1; continue
  fi
  case $CLASS in pmem|mixed) ndctl list -R ;; all-classes) ndctl list -R; vgs; lvs -a ;; *) vgs "$LVM_VG"; lvs -a "$LVM_VG" ;; esac
  phase "class $CLASS: deploy ${OVERLAY#"$REPO"/}"
  kubectl apply -k "$OVERLAY" >"$LOGS/apply-$CLASS.log" 2>&1 || { cat "$LOGS/apply-$CLASS.log"; }
  if ( set -e; wait_until 200 "DaemonSet localvol-node Ready ($CLASS)" daemon_ready ) >"$LOGS/deploy-$CLASS.log" 2>&1; then
    result "PASS deploy $CLASS $((SECONDS - start))s"
    for s in "${SCENARIOS[@]}"; do
      if why=$(not_for_class "$s" "$CLASS"); then result "SKIP $s $CLASS 0s ($why)"; continue; fi
      phase "class $CLASS: $s"
      start=$SECONDS
      ( set -e; "$s" ) >"$LOGS/$s-$CLASS.log" 2>&1
      rc=$?
      if [ $rc = 0 ]; then
        result "PASS $s $CLASS $((SECONDS - start))s"
        sed -n 's/^  \[[0-9:]*\] NOTE /    /p' "$LOGS/$s-$CLASS.log"
      else
        result "FAIL $s $CLASS $((SECONDS - start))s"
        failed=1
        echo "---- $s on $CLASS failed; its log:"; sed 's/^/    /' "$LOGS/$s-$CLASS.log" | tail -40
        # CI keeps the output only: what the daemon and kubelet said about the driver.
        echo "---- the daemon's log (its last 30 lines):"
        kubectl -n "$SYSTEM_NS" logs ds/localvol-node -c localvol --tail=30 2>&1 | sed 's/^/    /'
        echo "---- kubelet on the driver (its last 20 lines naming it or plugin registration):"
        grep -E "$DRIVER|plugin_watcher|RegisterPlugin|csi_plugin" "$KUBE_KIT_STATE/logs/kubelet.log" 2>/dev/null | tail -n 20 | cut -c1-400 | sed 's/^/    /'
      fi
    done
  else
    cat "$LOGS/deploy-$CLASS.log"
    kubectl -n "$SYSTEM_NS" describe pods >"$LOGS/describe-$CLASS.txt" 2>&1
    result "FAIL deploy $CLASS $((SECONDS - start))s"; failed=1
  fi
  phase "class $CLASS: cleanup"
  start=$SECONDS
  cok=0
  undeploy || cok=1
  # The daemon removed its volumes, and their device nodes with their LVs (only the thin
  # pool's, which the host's LVM made, may be left).
  left=$(storage overlay left "$CLASS") || { echo "cleanup: volumes left:"; echo "$left"; cok=1; }
  storage overlay remove "$CLASS" "$VG_DISK" >>"$LOGS/storage-$CLASS.log" 2>&1 || { echo "cleanup: cannot remove the storage of $CLASS"; tail -5 "$LOGS/storage-$CLASS.log"; cok=1; }
  left=$(storage residue) || { echo "cleanup: storage left:"; echo "$left"; cok=1; dmsetup remove_all -f || true; vgremove -f "$LVM_VG" >/dev/null 2>&1; }
  if [ -n "$UDEV_PID" ]; then
    if udev_stop "$CLASS" >>"$LOGS/udev-$CLASS.log" 2>&1; then result "PASS udev $CLASS 0s ($(tail -n 1 "$LOGS/udev-$CLASS.log"))"
    else tail -n 5 "$LOGS/udev-$CLASS.log"; result "FAIL udev $CLASS 0s"; failed=1; fi
    UDEV_PID=""
  fi
  if [ $cok = 0 ]; then result "PASS cleanup $CLASS $((SECONDS - start))s"; else result "FAIL cleanup $CLASS $((SECONDS - start))s"; failed=1; fi
done

phase "stop-node.sh --purge"
cp "$KUBE_KIT_STATE"/logs/*.log "$LOGS/" 2>/dev/null
start=$SECONDS
"$GUEST_RECIPE/stop-node.sh" --purge >"$LOGS/stop-node.log" 2>&1 || { echo "stop-node.sh --purge failed"; failed=1; }
# Nothing of the volumes may be left: no mount below kubelet's root or localvol's data
# dir, no LV, no device-mapper device.
if left=$(storage residue --mounts); then result "PASS final-state all $((SECONDS - start))s"
else echo "left in the guest:"; echo "$left"; result "FAIL final-state all $((SECONDS - start))s"; failed=1; fi
phase "done"
exit $failed
