#!/usr/bin/env bash
# tests/vm/cluster.sh - localvol under a real kubelet on the LVM classes: one QEMU guest
# (tests/vm/run.sh) runs a kube-kit node (recipe/guest-prep.sh, start-node.sh), and per
# device class deploys the shipped overlay (deploy/overlays/CLASS through
# tests/cluster/overlays/CLASS: only the image and the host network changed) on storage
# made as that overlay's config.yaml expects, then runs tests/cluster's scenarios on it.
#
#   tests/vm/cluster.sh [-v] [--classes lvm-thin,lvm,pmem,pmem-lvm,mixed,all-classes] [SCENARIO...]    (root)
#
# Scenarios: names or numbers of tests/cluster/scenarios; classes, in the order given.
# The defaults, the scenarios and classes it knows, and which scenario does not run on
# which class and why are tests/plan.yaml's guest_cluster (`plan show`): the default
# scenarios are the ones parametrised by class (4, the longest, last), and mixed
# (tests/cluster/overlays/mixed: loop, pmem and lvm classes in one configuration) and
# all-classes (tests/cluster/overlays/all-classes: every kind of class in one
# configuration, bench/cluster/guest.sh's) run only their own scenarios. A scenario that
# cannot apply to a class is reported SKIP with the reason.
# The host builds everything (the kit install, the debug localvol, the image archives,
# the node's packages: the guest's root is the host's); the guest does the rest
# (tests/vm/cluster-guest.sh). Prints one line per scenario x class with its wall time,
# then PASS or FAIL; exits non-zero on any failure. Logs are kept (path printed) only on
# failure. tests/all.sh runs it once per lane of the plan's guest_cluster.lanes, with
# its .scenarios, the lanes side by side (tests/vm/README.md).
#
# The node's control plane, the tap device and QEMU run in a network namespace of this
# run's own (the part after "in a network namespace" below, which this script runs as
# `cluster.sh --in-netns RUN_DIR ...`): the kit's ports are fixed (6443, 12379, 12380,
# 10257), and each namespace has its own loopback, so the host's cluster suite and
# another guest cluster run beside it. What needs the network (packages, the kernel's
# modules, udev) runs first, in the host's.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
KIT=${KUBE_KIT:-$REPO/../shared/kube-kit}
export KUBE_KIT_BIN=${KUBE_KIT_BIN:-/var/cache/kube-kit/bin}
IMAGE_CACHE=/var/cache/localvol-image
VM_CACHE=/var/cache/localvol-vm
# shellcheck source=tests/plan/plan.sh
source tests/plan/plan.sh
CLASSES=$(plan get guest_cluster.default_classes --sep ,)
configurations=$(plan get guest_cluster.configurations)
VERBOSE=() args=() IN_NETNS=""
while [ $# -gt 0 ]; do
  case $1 in
    -v) VERBOSE=(-v) ;;
    --in-netns) IN_NETNS=$2; shift ;;
    --classes) CLASSES=$2; shift ;;
    *) args+=("$1") ;;
  esac
  shift
done
IFS=, read -r -a class_list <<<"$CLASSES"
for c in "${class_list[@]}"; do
  [[ " $configurations " == *" $c "* && $c != *" "* && -n $c ]] ||
    { echo "tests/vm/cluster.sh: class $c: one of ${configurations// /, }" >&2; exit 2; }
done
plan_words ALL get guest_cluster.default_scenarios
# Not among the defaults: ReclaimSpace and snapshots (lvm-thin only: the classes that
# give space back and take snapshots), Kubernetes' storage e2e suites (lvm-thin only;
# S11_GUEST_FOCUS; LOCALVOL_E2E_FOCUS and S11_FSTYPE reach the guest with the rest of
# the environment), the mixed node, encryption at rest.
plan_words EXTRA_SCENARIOS get guest_cluster.extra_scenarios
# LOCALVOL_CLUSTER_EXTRA: a file of more scenarios, relative to the repository, which
# adds their names to EXTRA_SCENARIOS (bench/cluster/guest.sh's); the guest sources it too.
# shellcheck disable=SC1090
if [ -n "${LOCALVOL_CLUSTER_EXTRA:-}" ]; then source "$LOCALVOL_CLUSTER_EXTRA"; fi
# shellcheck source=tests/cluster/lib.sh
source tests/cluster/lib.sh
selected=()   # select_scenarios (lib.sh) fills it
select_scenarios ${args[@]+"${args[@]}"}
[ "$(id -u)" = 0 ] || { echo "tests/vm/cluster.sh: run as root" >&2; exit 1; }
[ -x "$KIT/install.sh" ] || { echo "tests/vm/cluster.sh: no kube-kit at $KIT" >&2; exit 1; }

t0=$SECONDS
phase() { printf '==== vm-cluster: %s (%ss)\n' "$1" "$((SECONDS - t0))"; }
TAP=lvvm0 TAP_HOST=10.204.0.1 TAP_GUEST=10.204.0.2

# ---------------------------------------------------------------- in a network namespace
# The control plane (etcd, kube-apiserver, kube-controller-manager) on the host, where
# it runs natively: under TCG in the guest, beside the node, it took most of the guest's
# CPU (tests/vm/README.md). The guest's kubelet, its pods and the harness's kubectl reach
# it as a node's would reach an API server: over the network, here a tap device to the
# host, where CP_PROXY forwards the API's port to the loopback address it listens on;
# the guest forwards its own 127.0.0.1:6443, the address in the kit's kubeconfigs and
# certificate, to the host's (cluster-guest.sh). All of it in this run's network
# namespace (the outer run made it, and made RUN_DIR): its loopback holds the kit's
# fixed ports, its tap device the guest's NIC. Exits with the guest's status.
# CP_STATE is the control plane's kube-kit state; RELAY_PID serves the guest harness's
# kubectl calls (tests/vm/kubectl-relay.sh); SNAPSHOT_CONTROLLER_PID is the cluster's
# snapshot-controller, which runs here too.
node_in_netns() {
  RUN=$IN_NETNS LOGS=$IN_NETNS/logs
  CP_STATE=$RUN/control-plane CP_PROXY="" RELAY_PID="" SNAPSHOT_CONTROLLER_PID=""
  stop_control_plane() {
    local rc=$?
    # A signal's `exit 130` would end the cleanup at its next command: the signal that
    # brought us here is handled, and another one waits until the cleanup is done.
    trap '' INT TERM
    [ -z "$SNAPSHOT_CONTROLLER_PID" ] || kill "$SNAPSHOT_CONTROLLER_PID" 2>/dev/null || true
    [ -z "$RELAY_PID" ] || { pkill -P "$RELAY_PID"; kill "$RELAY_PID"; } 2>/dev/null || true
    # socat serves each connection in a child of its own.
    [ -z "$CP_PROXY" ] || { pkill -P "$CP_PROXY"; kill "$CP_PROXY"; } 2>/dev/null || true
    if [ -d "$CP_STATE" ]; then
      cp "$CP_STATE"/logs/*.log "$LOGS/" 2>/dev/null || true
      KUBE_KIT_STATE=$CP_STATE "$KIT/recipe/stop-kube.sh" --purge >>"$LOGS/control-plane.log" 2>&1 || true
      rm -rf "$CP_STATE"
    fi
    exit $rc
  }
  trap stop_control_plane EXIT
  trap 'exit 130' INT TERM
  phase "control plane, tap $TAP (network namespace $(ip netns identify))"
  KUBE_KIT_STATE=$CP_STATE "$KIT/recipe/start-kube.sh" --kcm -- \
    --kubelet-client-certificate="$CP_STATE/pki/admin.crt" --kubelet-client-key="$CP_STATE/pki/admin.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname >"$LOGS/control-plane.log" 2>&1 ||
    { cat "$LOGS/control-plane.log"; exit 1; }
  ip tuntap add dev "$TAP" mode tap && ip addr add "$TAP_HOST/24" dev "$TAP" && ip link set "$TAP" up
  socat "TCP-LISTEN:6443,bind=$TAP_HOST,fork,reuseaddr" TCP:127.0.0.1:6443 2>>"$LOGS/control-plane.log" &
  CP_PROXY=$!
  # From here on the host's kubectl, the snapshot-controller and the relay talk to this
  # control plane (the guest sets its own KUBECONFIG).
  export KUBECONFIG=$CP_STATE/kubeconfig PATH=$KUBE_KIT_BIN:$PATH
  for _ in $(seq 300); do
    kubectl -n default get serviceaccount default >/dev/null 2>&1 && break
    sleep 0.1
  done
  # Scenarios 9 and 11: the VolumeSnapshot CRDs and the snapshot-controller, before any
  # class deploys (the lvm-thin overlay carries the csi-snapshotter component).
  start_snapshot_controller "$KIT/recipe" "$LOGS"   # lib.sh
  # shellcheck source=tests/vm/kubectl-relay.sh
  source tests/vm/kubectl-relay.sh
  mkdir -p "$RUN/kubectl-relay"
  relay_serve "$RUN/kubectl-relay" "$KUBE_KIT_BIN/kubectl" &
  RELAY_PID=$!
  # The guest finds the rest in RUN_DIR: the control plane's state, the relay's
  # directory, and the addresses of its end of the tap device and of the host's.
  echo "$TAP_HOST $TAP_GUEST" >"$RUN/tap-addresses"

  phase "guest: ${class_list[*]} x ${selected[*]}"
  local pmem=0 rc=0
  [[ ",$CLASSES," == *,pmem,* || ",$CLASSES," == *,pmem-lvm,* || ",$CLASSES," == *,mixed,* || ",$CLASSES," == *,all-classes,* ]] && pmem=1G
  # A Kubernetes node runs a dozen large Go programs and starts more (kubectl, runc, CNI
  # plugins): a TCG code cache of 1 GiB, not run.sh's 256 MiB, which such a guest can fill
  # (one run each, on lvm-thin: scenario 2 took 285 s against 431 s; node start the same).
  LOCALVOL_VM_TB_SIZE=${LOCALVOL_VM_TB_SIZE:-1024} \
    tests/vm/run.sh "${VERBOSE[@]}" --tap "$TAP" --disks 2 --attach "$RUN/containerd-root.img" --disk-size 16G --mem 4G --pmem-size "$pmem" --timeout 5400 \
    -- bash "$REPO/tests/vm/cluster-guest.sh" "$RUN" "$CLASSES" "${selected[@]}" 2>&1 | tee "$LOGS/guest.log" || rc=${PIPESTATUS[0]}
  return "$rc"
}
if [ -n "$IN_NETNS" ]; then
  rc=0; node_in_netns || rc=$?
  exit "$rc"
fi

target=$(realpath "${CARGO_TARGET_DIR:-target}")
mkdir -p "$target"
# Shared with the guest (the project, or $CARGO_TARGET_DIR, is shared read-write).
RUN=$(mktemp -d "$target/vm-cluster.XXXXXX")
LOGS=$RUN/logs
mkdir -p "$LOGS" "$RUN/images"
keep=0
NETNS=""
cleanup() {
  local rc=$?
  # A signal's `exit 130` would end the cleanup at its next command: the signal that
  # brought us here is handled, and another one waits until the cleanup is done.
  trap '' INT TERM
  rm -rf "$RUN/images" "$RUN/containerd-root.img"
  [ -z "$NETNS" ] || ip netns del "$NETNS" 2>/dev/null || true
  if [ $rc = 0 ] && [ $keep = 0 ]; then rm -rf "$RUN"; else echo "vm-cluster: logs kept in $LOGS"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- on the host
# One run's preparation at a time (tests/all.sh runs two guest clusters): the caches
# below are made in place.
mkdir -p "$VM_CACHE"
exec 8>"$VM_CACHE/cluster-prep.lock"
flock 8
phase "kit, binary, packages"
"$KIT/install.sh" /var/cache/kube-kit >"$LOGS/install.log"
# LOCALVOL_CLUSTER_BINARY: a built localvol for the image instead of the debug build
# (bench/cluster/guest.sh's release build).
BINARY=${LOCALVOL_CLUSTER_BINARY:-${CARGO_TARGET_DIR:-target}/debug/localvol}
if [ -z "${LOCALVOL_CLUSTER_BINARY:-}" ]; then
  cargo build --locked --bin localvol 2>"$LOGS/cargo.log" || { cat "$LOGS/cargo.log"; exit 1; }
fi
# The Rust scenarios' test binary, for the guest to run (lib.sh's test_binary there takes
# it from LOCALVOL_SCENARIOS_BIN: cargo in the guest would cost minutes of emulation),
# copied into the run's directory so that another build cannot replace it meanwhile.
bin=$(test_binary scenarios)   # lib.sh
[ -x "$bin" ] || { echo "tests/vm/cluster.sh: cannot build tests/scenarios" >&2; exit 1; }
cp "$bin" "$RUN/scenarios"
export LOCALVOL_SCENARIOS_BIN=$RUN/scenarios
# The testkit's guest-storage, which makes and checks each class's storage there.
cargo build --locked -p localvol-testkit --bin guest-storage 2>>"$LOGS/cargo.log" || { cat "$LOGS/cargo.log"; exit 1; }
cp "${CARGO_TARGET_DIR:-target}/debug/guest-storage" "$RUN/guest-storage"
install_node_packages "$LOGS"        # lib.sh
rootfs=$(image_rootfs "$IMAGE_CACHE" "$LOGS")
phase "image archives"
build_image_archives "$RUN/images" "$BINARY" "$rootfs" "$KIT/recipe"   # lib.sh

# containerd's image store for the guest's node, made here: importing the archives there,
# under TCG, took 180 s of the node's start (hashing and unpacking 250 MB, emulated), and
# unpacking a tar of the store 45 s. A containerd of the node's version imports them into
# a store of its own, with the snapshotter the node uses (overlayfs), written into an ext4
# image (mkfs.ext4 -d) that the guest mounts as its node's containerd root
# (cluster-guest.sh); start-node.sh then finds the images there. The store keeps no
# absolute path: its directory may differ from the node's.
phase "containerd image store"
make_image_store() { # ARCHIVE_DIR OUT_IMAGE
  local store rc=0 pid f
  store=$(mktemp -d /var/tmp/localvol-vm-store.XXXXXX)
  printf 'version = 2\nroot = "%s/root"\nstate = "%s/state"\ndisabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "%s/sock"\n' \
    "$store" "$store" "$store" >"$store/config.toml"
  containerd --config "$store/config.toml" >"$LOGS/image-store.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do ctr --address "$store/sock" version >/dev/null 2>&1 && break; sleep 0.1; done
  for f in "$1"/*.tar; do
    ctr --address "$store/sock" -n k8s.io images import --snapshotter overlayfs "$f" >>"$LOGS/image-store.log" 2>&1 || { rc=1; break; }
  done
  kill "$pid"; wait "$pid" 2>/dev/null
  # Room for what the node adds: its pods' containers and logs stay on its own disk.
  [ $rc = 0 ] && truncate -s 4G "$2" && mkfs.ext4 -q -F -d "$store/root" "$2" >>"$LOGS/image-store.log" 2>&1 || rc=1
  rm -rf "$store"
  [ $rc = 0 ] || { tail -n 20 "$LOGS/image-store.log"; return 1; }
}
make_image_store "$RUN/images" "$RUN/containerd-root.img"
rm -rf "$RUN/images"   # in the store now

# The guest kernel's whole module tree: run.sh unpacks only the storage modules, and the
# node needs bridge, veth, dummy, br_netfilter, nf_conntrack and nf_tables as well.
# Unpacked once from the same kernel package into $VM_CACHE/cluster-modules-KVER.
kernel_dir() { find "$VM_CACHE" -maxdepth 2 -name .complete -path '*/kernel-*' -printf '%h\n' 2>/dev/null | sort -V | tail -n 1; }
if [ -z "$(kernel_dir)" ]; then
  phase "guest kernel (tests/vm/run.sh -- true)"
  tests/vm/run.sh -- true
fi
KVER=$(ls "$(kernel_dir)/lib/modules")
MODS=$VM_CACHE/cluster-modules-$KVER
if [ ! -f "$MODS/.complete" ]; then
  phase "guest kernel modules ($KVER, once)"
  tmp=$(mktemp -d "$VM_CACHE/tmp.XXXXXX")
  ( cd "$tmp" && apt-get download "linux-image-$KVER" ) >"$LOGS/modules.log" 2>&1 ||
    { apt-get update >>"$LOGS/modules.log" 2>&1 && ( cd "$tmp" && apt-get download "linux-image-$KVER" ) >>"$LOGS/modules.log" 2>&1; } ||
    { cat "$LOGS/modules.log"; rm -rf "$tmp"; exit 1; }
  mkdir "$tmp/root"
  dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp/root" './lib/modules'
  depmod -b "$tmp/root" "$KVER"
  rm -rf "$MODS"; mv "$tmp/root/lib/modules/$KVER" "$MODS"; rm -rf "$tmp"; touch "$MODS/.complete"
fi
# The guest bind-mounts it over its /lib/modules/KVER (its / is the host's).

# A production host's udev (issue 32): Debian's udev package, unpacked in the guest for
# the plan's guest_cluster.udev_classes, with the lvm.conf Debian ships (udev_sync and
# udev_rules on). The package of the host's libudev1 version (it requires that exact
# one), or else the mirror's newest with its libudev1, which then goes into the guest's
# overlay root only. Cached in $VM_CACHE/udev.
# cluster-guest.sh asks the plan the same (with a person's LOCALVOL_SELECT).
UDEV_CLASSES=$(plan get guest_cluster.udev_classes --sep ,)
if [ -n "$UDEV_CLASSES" ]; then
  phase "udev for the guest ($UDEV_CLASSES)"
  udev_cache=$VM_CACHE/udev
  v=$(dpkg-query -W -f '${Version}' libudev1)
  if ! ls "$udev_cache/udev_${v//:/%3a}_"*.deb >/dev/null 2>&1; then
    tmp=$(mktemp -d "$VM_CACHE/tmp.XXXXXX")
    if ! ( cd "$tmp" && apt-get download "udev=$v" ) >"$LOGS/udev.log" 2>&1; then
      v=$(apt-cache policy udev | awk '$1 == "Candidate:" {print $2}')
      ( cd "$tmp" && apt-get download "udev=$v" "libudev1=$v" ) >>"$LOGS/udev.log" 2>&1 ||
        { apt-get update >>"$LOGS/udev.log" 2>&1 && ( cd "$tmp" && apt-get download "udev=$v" "libudev1=$v" ) >>"$LOGS/udev.log" 2>&1; } ||
        { cat "$LOGS/udev.log"; rm -rf "$tmp"; exit 1; }
    fi
    rm -rf "$udev_cache"; mv "$tmp" "$udev_cache"; chmod 755 "$udev_cache"
  fi
  mkdir -p "$RUN/udev"
  cp "$udev_cache"/*.deb "$RUN/udev/"
  # The host's lvm.conf, if it is Debian's as shipped (the conffile's checksum).
  sum=$(dpkg-query -W -f '${Conffiles}\n' lvm2 | awk '$1 == "/etc/lvm/lvm.conf" {print $2}')
  [ "$(md5sum </etc/lvm/lvm.conf | cut -d' ' -f1)" = "$sum" ] ||
    { echo "tests/vm/cluster.sh: /etc/lvm/lvm.conf here is not the one lvm2 ships (md5 $sum)" >&2; exit 1; }
  cp /etc/lvm/lvm.conf "$RUN/udev/lvm.conf"
fi

command -v socat >/dev/null || install_packages "$LOGS" socat   # lib.sh
flock -u 8

# This run's network namespace, and the part of this script that runs in it.
NETNS=localvol-vm-${RUN##*.}
netns_dir_shared   # lib.sh
ip netns add "$NETNS" && ip -n "$NETNS" link set lo up ||
  { echo "tests/vm/cluster.sh: cannot make the network namespace $NETNS" >&2; exit 1; }
rc=0
guest_start=$SECONDS
ip netns exec "$NETNS" "$REPO/tests/vm/cluster.sh" --in-netns "$RUN" "${VERBOSE[@]}" --classes "$CLASSES" "${selected[@]}" || rc=$?
guest_took=$((SECONDS - guest_start))

# ---------------------------------------------------------------- the verdict
failed=0
[ "$rc" = 0 ] || { echo "vm-cluster: the guest exited $rc"; failed=1; }
echo
echo "vm-cluster results (scenario class wall):"
[ -s "$RUN/results" ] && sed 's/^/  /' "$RUN/results"
grep -q '^FAIL' "$RUN/results" 2>/dev/null && failed=1
# Every scenario x class has its PASS line (or its SKIP line, which the guest writes
# only for what its not_for_class names, with the reason), and so has the final state:
# a run that did not get there did not pass.
for c in "${class_list[@]}"; do
  for s in deploy "${selected[@]}" cleanup; do
    grep -qE "^(PASS|SKIP) $s $c " "$RUN/results" 2>/dev/null || { echo "  missing: $s $c"; failed=1; }
  done
done
for c in "${class_list[@]}"; do
  [[ ",${UDEV_CLASSES}," != *",$c,"* ]] || grep -qE "^PASS udev $c " "$RUN/results" 2>/dev/null || { echo "  missing: udev $c"; failed=1; }
done
grep -q '^PASS final-state ' "$RUN/results" 2>/dev/null || { echo "  missing: final-state"; failed=1; }
[ -f "$RUN/results.times" ] && echo "guest: $(cat "$RUN/results.times")"
echo "guest wall time ${guest_took}s; total ${SECONDS}s"
if [ $failed = 0 ]; then echo "vm-cluster: PASS"; else keep=1; echo "vm-cluster: FAIL"; exit 1; fi
