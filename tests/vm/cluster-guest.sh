#!/usr/bin/env bash
# tests/vm/cluster-guest.sh - the guest side of tests/vm/cluster.sh (run by it through
# tests/vm/run.sh, never by hand): a kube-kit node in this QEMU guest, localvol deployed
# from a shipped overlay per device class, tests/cluster's scenarios on that class.
#
#   cluster-guest.sh RUN_DIR CLASSES SCENARIO...
#
# RUN_DIR (shared with the host) holds images/*.tar (localvol and the sidecars, built on
# the host). /var/cache/localvol-vm/cluster-modules-KVER (made by cluster.sh) is the guest
# kernel's whole module tree: the bridge, veth, netfilter and dummy modules the node
# needs are not in run.sh's.
# Disks: /dev/vda for guest-prep.sh (the node's state, kubelet's root), /dev/vdb for the
# volume group `localvol` of the lvm classes (the name deploy/overlays/lvm*/config.yaml
# expects); the NVDIMM's region0 for the pmem classes (deploy/overlays/pmem/config.yaml;
# for pmem-lvm, deploy/overlays/pmem-lvm/config.yaml's VG `localvol-pmem` on its one
# fsdax namespace), labelled here as new hardware would be. Writes RUN_DIR/results ("PASS|FAIL|SKIP
# SCENARIO CLASS SECONDS" lines, then "PASS|FAIL final-state") and RUN_DIR/logs/.
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
REGISTRATION=builtin
read -r UP0 _ </proc/uptime
T0=$SECONDS
phase() { read -r up _ </proc/uptime; printf '==== guest: %s (%ss since the command started, uptime %ss)\n' "$1" "$((SECONDS - T0))" "${up%.*}"; }
result() { echo "$*" >>"$RESULTS"; echo "RESULT $*"; }

# shellcheck source=tests/cluster/lib.sh
source "$HERE/lib.sh"
for s in "${SCENARIOS[@]}"; do
  f=$HERE/scenarios/$s.sh
  [ -f "$f" ] || { echo "cluster-guest.sh: no scenario $f" >&2; exit 2; }
  # shellcheck disable=SC1090
  source "$f"
done

# ---------------------------------------------------------------- the node
phase "modules"
MODS=/var/cache/localvol-vm/cluster-modules-$(uname -r)
[ -f "$MODS/.complete" ] || { echo "FATAL: no $MODS (tests/vm/cluster.sh makes it)" >&2; exit 1; }
mount --bind "$MODS" "/lib/modules/$(uname -r)" || { echo "FATAL: cannot mount $MODS" >&2; exit 1; }
modprobe dm_thin_pool; modprobe dm_snapshot
phase "guest-prep.sh /dev/vda"
"$KIT/recipe/guest-prep.sh" /dev/vda >"$LOGS/guest-prep.log" 2>&1 || { cat "$LOGS/guest-prep.log"; exit 1; }
mkdir -p "$KUBE_KIT_STATE/images"
cp "$RUN"/images/*.tar "$KUBE_KIT_STATE/images/"
phase "start-node.sh"
if ! "$KIT/recipe/start-node.sh" >"$LOGS/start-node.log" 2>&1; then
  tail -30 "$LOGS/start-node.log"
  cp "$KUBE_KIT_STATE"/logs/*.log "$LOGS/" 2>/dev/null
  exit 1
fi
read -r up _ </proc/uptime
NODE_READY_AT=${up%.*}
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
    *) echo "FATAL: class $1 not supported here" >&2; exit 2 ;;
  esac
  BLOCK_SIZE=32Mi OVERLAY=$HERE/overlays/$1
  # deploy/overlays/pmem-lvm/config.yaml's VG; deploy/overlays/lvm*/config.yaml's.
  if [ "$1" = pmem-lvm ]; then LVM_VG=localvol-pmem; else LVM_VG=localvol; fi
  # Scenario 4 grows the class's own fstype (ext4 grows online here: root has
  # CAP_SYS_RESOURCE in the guest) by --node-resizer, on every class that grows. Its half
  # with the central csi-resizer is left to the host suite: the sidecar reaches the same
  # ControllerExpandVolume and backend growth that --node-resizer runs here.
  S4_FSTYPE=$FSTYPE S4_CLASS=lvtest-$FSTYPE S4_CENTRAL_OVERLAY=
}
# Scenarios that do not apply to a class, or repeat what another class's run proves
# (issue 32: cut repetition, not coverage), and why.
not_for_class() { # SCENARIO CLASS
  case $1:$2 in
    s3_ephemeral:lvm|s3_ephemeral:pmem|s3_ephemeral:pmem-lvm) echo "the owner check does not depend on the backend, and an ephemeral volume's storage lives as s2's claims do; s3 runs on lvm-thin" ;;
    s6_daemon_restart:lvm|s6_daemon_restart:pmem-lvm) echo "the LVM backend's restart, which lvm-thin's run covers; s6 runs on lvm-thin and pmem" ;;
    s4_expansion:pmem-lvm) echo "LVM thick growth (lvextend, then the filesystem), which lvm's run covers" ;;
    s11_e2e_storage:lvm|s11_e2e_storage:pmem|s11_e2e_storage:pmem-lvm) echo "the e2e driver definition's promises (snapshots, clones) hold on lvm-thin; the guest runs the suites there" ;;
    s12_mixed_node:mixed) return 1 ;;
    *:mixed) echo "the mixed node runs scenario 12; each class's own run covers the rest" ;;
    s12_mixed_node:*) echo "a configuration of its own: the mixed run's" ;;
    *) return 1 ;;
  esac
}

# The storage the overlay's config.yaml expects on the node.
make_storage() { # CLASS
  case $1 in
    pmem|pmem-lvm|mixed)   # an empty, labelled region0 (tests/vm/README.md)
      ndctl disable-region region0 && ndctl init-labels -f nmem0 && ndctl enable-region region0 || return 1 ;;
  esac
  case $1 in
    # mixed: the lvm class's volume group is missing; scenario 12 makes it.
    pmem|mixed) return 0 ;;
    # deploy/overlays/pmem-lvm/config.yaml: the VG localvol-pmem on the region's one
    # fsdax namespace, as its comment tells the operator to make it.
    pmem-lvm)
      local dev
      dev=/dev/$(ndctl create-namespace --mode fsdax --region region0 | python3 -c 'import json, sys; print(json.load(sys.stdin)["blockdev"])') &&
        pvcreate -q -y "$dev" && vgcreate -q localvol-pmem "$dev"
      return ;;
  esac
  pvcreate -q -y "$VG_DISK" && vgcreate -q localvol "$VG_DISK" || return 1
  case $1 in
    # deploy/overlays/lvm-thin/config.yaml: thin pool localvol/pool0.
    lvm-thin) lvcreate -q --type thin-pool -L 2G -n pool0 localvol ;;
    # deploy/overlays/lvm/config.yaml: spare-gb 10 of the VG is never handed out.
    lvm) true ;;
  esac
}
# LVs left in the class's VG other than its own thin pool (and its hidden sub-LVs).
volume_lvs() { lvs --noheadings -o lv_name "$LVM_VG" 2>/dev/null | awk '$1 != "pool0" && $1 !~ /^\[/ {print $1}'; }
# fsdax namespaces with a size: what localvol makes (not the raw namespace a label-less
# region shows at boot, nor a region's idle seed namespace, which has none).
pmem_namespaces() {
  ndctl list -N -i 2>/dev/null | python3 -c 'import json, sys
d = sys.stdin.read().strip()
v = json.loads(d) if d else []
for n in v if isinstance(v, list) else [v]:
    if n.get("size", 0) and n.get("mode") == "fsdax": print(n.get("dev"), n.get("name", ""), n.get("size"))'
}
# The fsdax namespaces that are volumes: for pmem-lvm, not the one under its VG.
volume_namespaces() {
  if [ "$CLASS" = pmem-lvm ]; then
    local under; under=$(pvs --noheadings -o pv_name --select "vg_name=$LVM_VG" 2>/dev/null | tr -d ' ')
    pmem_namespaces | while read -r dev name size; do
      [ "/dev/$(ndctl list -n "$dev" | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["blockdev"])')" = "$under" ] ||
        echo "$dev $name $size"
    done
  else pmem_namespaces; fi
}
remove_storage() { # CLASS
  case $1 in
    pmem) return 0 ;;
    mixed) ! vgs localvol >/dev/null 2>&1 || { vgremove -q -f localvol && pvremove -q "$VG_DISK"; } ;;
    pmem-lvm)
      local under; under=$(pvs --noheadings -o pv_name --select "vg_name=$LVM_VG" | tr -d ' ')
      vgremove -q -f "$LVM_VG" && pvremove -q "$under" && ndctl destroy-namespace -f all --region region0 ;;
    *) vgremove -q -f localvol && pvremove -q "$VG_DISK" ;;
  esac
}
# Loop backing files of localvol's, and loop devices attached to one.
loop_volumes() {
  ls /var/lib/localvol/loop/*.img 2>/dev/null
  losetup -n -O NAME,BACK-FILE 2>/dev/null | grep /var/lib/localvol/ || true
}
# Device-mapper devices: none may be left once the storage is removed.
dm_devices() { dmsetup ls 2>/dev/null | grep -v '^No devices found' || true; }

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
  while [ $SECONDS -lt $end ] && { kubectl get ns -o name | grep -q lvtest- || [ -n "$(kubectl get pv -o name)" ]; }; do sleep 2; done
  local ok=0
  [ -z "$(kubectl get pv -o name)" ] || { echo "cleanup: volumes left: $(kubectl get pv -o name | tr '\n' ' ')"; ok=1; }
  kubectl delete -k "$OVERLAY" --wait=false >/dev/null 2>&1
  end=$((SECONDS + 300))
  while [ $SECONDS -lt $end ] && kubectl get ns "$SYSTEM_NS" >/dev/null 2>&1; do sleep 2; done
  kubectl get ns "$SYSTEM_NS" >/dev/null 2>&1 && { echo "cleanup: namespace $SYSTEM_NS not deleted"; ok=1; }
  return $ok
}

failed=0
for CLASS in "${CLASSES[@]}"; do
  class_env "$CLASS"
  export CLASS_KIND DEVICE_CLASS SC FSTYPE FS_SIZE BLOCK_SIZE LVM_VG OVERLAY
  phase "class $CLASS: storage"
  start=$SECONDS
  if ! make_storage "$CLASS" >"$LOGS/storage-$CLASS.log" 2>&1; then
    cat "$LOGS/storage-$CLASS.log"; result "FAIL deploy $CLASS $((SECONDS - start))s (storage)"; failed=1; continue
  fi
  case $CLASS in pmem|mixed) ndctl list -R ;; *) vgs "$LVM_VG"; lvs -a "$LVM_VG" ;; esac
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
  left=$(volume_lvs; volume_namespaces; loop_volumes)
  [ -z "$left" ] || { echo "cleanup: volumes left (LVs in $LVM_VG, fsdax namespaces, loop files or devices): $left"; cok=1; }
  remove_storage "$CLASS" >>"$LOGS/storage-$CLASS.log" 2>&1 || { echo "cleanup: cannot remove the storage of $CLASS"; tail -5 "$LOGS/storage-$CLASS.log"; cok=1; }
  left=$(dm_devices; pmem_namespaces)
  [ -z "$left" ] || { echo "cleanup: device-mapper devices or namespaces left: $left"; cok=1; dmsetup remove_all -f || true; vgremove -f "$LVM_VG" >/dev/null 2>&1; }
  if [ $cok = 0 ]; then result "PASS cleanup $CLASS $((SECONDS - start))s"; else result "FAIL cleanup $CLASS $((SECONDS - start))s"; failed=1; fi
done

phase "stop-node.sh --purge"
cp "$KUBE_KIT_STATE"/logs/*.log "$LOGS/" 2>/dev/null
start=$SECONDS
"$KIT/recipe/stop-node.sh" --purge >"$LOGS/stop-node.log" 2>&1 || { echo "stop-node.sh --purge failed"; failed=1; }
# Nothing of the volumes may be left: no mount below kubelet's root or localvol's data
# dir, no LV, no device-mapper device.
left=$(awk '$5 ~ "^/var/lib/(kubelet|localvol)/" {print "mount " $5}' /proc/self/mountinfo; dm_devices;
       lvs --noheadings -o vg_name,lv_name 2>/dev/null; pmem_namespaces)
if [ -z "$left" ]; then result "PASS final-state all $((SECONDS - start))s"
else echo "left in the guest:"; echo "$left"; result "FAIL final-state all $((SECONDS - start))s"; failed=1; fi
phase "done"
exit $failed
