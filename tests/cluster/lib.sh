# shellcheck shell=bash  # sourced, never run
# tests/cluster/lib.sh - what the cluster harnesses share; sourced by run.sh and
# tests/vm/cluster-guest.sh: the run's facts, which rust_scenario hands to the Rust
# scenarios (tests/scenarios), the waits and objects of the tool scenarios (10, 11) and
# bench/cluster, and the preparation of a node.

HOST_DATA_DIR=/var/lib/localvol
LOOP_DIR=$HOST_DATA_DIR/loop
DRIVER=localvol.csi.dev
NODE=${NODE_NAME:-node1}
SYSTEM_NS=localvol-system

# The device class the scenarios use, as the deployed overlay defines it. The host suite
# (run.sh) uses the loop overlay's defaults; tests/vm/cluster-guest.sh sets these for the
# lvm, lvm-thin, pmem and pmem-lvm overlays before each class's scenarios.
CLASS_KIND=${CLASS_KIND:-loop}        # loop | lvm | lvm-thin | pmem | pmem-lvm: how the host sees a volume
DEVICE_CLASS=${DEVICE_CLASS:-loop}    # localvol.csi.dev/device-class of the StorageClass
SC=${SC:-localvol-loop}               # the overlay's StorageClass
FSTYPE=${FSTYPE:-ext4}                # its csi.storage.k8s.io/fstype
FS_SIZE=${FS_SIZE:-64Mi}              # a filesystem claim (xfs: at least 320Mi, see tests/vm/README.md)
BLOCK_SIZE=${BLOCK_SIZE:-32Mi}        # a raw block claim
LVM_VG=${LVM_VG:-localvol}            # the volume group of the lvm classes
THIN_POOL=${THIN_POOL:-pool0}         # the thin pool of the lvm-thin overlays (deploy/overlays/lvm-thin/config.yaml)

fail() { echo "FAIL: $*" >&2; exit 1; }

# test_binary TARGET: the executable of the Rust test target TARGET (tests/), built here
# (cargo test --no-run: nothing to do after tests/all.sh's test build).
test_binary() { # TARGET
  (cd "$REPO" && cargo test --locked --no-run --test "$1" --message-format=json 2>/dev/null |
    grep "\"name\":\"$1\"" | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
}
# ignored_test BINARY NAME [VAR=VALUE...]: runs the #[ignore]d test NAME of the Rust test
# executable BINARY (test_binary's) with VAR=VALUE in its environment, showing its
# output's end and its NOTE lines; the scenario fails unless that one test ran and passed (a filter that
# matches nothing passes too).
ignored_test() {
  local bin=$1 name=$2 out rc=0
  shift 2
  [ -x "$bin" ] || fail "no test executable for $name ('$bin': could it be built?)"
  # No backtrace: a scenario fails with its message, and the panic that carries it is
  # always the same line of tests/scenarios/main.rs; a backtrace would push the message
  # out of the 30 lines shown.
  out=$(env RUST_BACKTRACE=0 "$@" "$bin" --ignored --exact "$name" --nocapture 2>&1) || rc=$?
  # The NOTE lines before the output's end too: tests/cluster/run.sh's summary takes them.
  printf '%s\n' "$out" | head -n -30 | grep '^  \[[0-9:]*\] NOTE ' || true
  printf '%s\n' "$out" | tail -n 30
  [ "$rc" = 0 ] || fail "test $name of $(basename "$bin") failed (exit $rc)"
  grep -q '^test result: ok. 1 passed' <<<"$out" || fail "test $name of $(basename "$bin") did not run"
}

# rust_scenario NAME [VAR=VALUE...]: the cluster scenario NAME of tests/scenarios (Rust,
# over kube-rs), with this run's facts in its environment (tests/scenarios/run.rs,
# Run::from_env) and the scenario's own VAR=VALUE. Its executable:
# LOCALVOL_SCENARIOS_BIN when set (tests/vm/cluster.sh resolves it on the host for its
# guest, where cargo itself would cost minutes of emulated CPU), else test_binary's.
rust_scenario() {
  local name=$1; shift
  ignored_test "${LOCALVOL_SCENARIOS_BIN:-$(test_binary scenarios)}" "$name" SC="$SC" DEVICE_CLASS="$DEVICE_CLASS" CLASS_KIND="$CLASS_KIND" \
    FSTYPE="$FSTYPE" FS_SIZE="$FS_SIZE" BLOCK_SIZE="$BLOCK_SIZE" THIN_POOL="$THIN_POOL" NODE_NAME="$NODE" LOOP_DIR="$LOOP_DIR" AUDIT_LOG="${AUDIT_LOG:-}" \
    OVERLAY="$OVERLAY" REGISTRATION="$REGISTRATION" LVM_VG="$LVM_VG" WAIT_SCALE="${WAIT_SCALE:-1}" VG_DISK="${VG_DISK:-}" "$@"
}

# volume_health_gate RECIPE: the kubelet of a copy of the kit's recipe (the kit itself is
# read-only) with the alpha CSIVolumeHealth gate on, so that it reads the volume condition
# of NodeGetVolumeStats (scenario 15 asserts its
# kubelet_volume_stats_health_status_abnormal). Both the host's node (run.sh) and the
# guest's (tests/vm/cluster-guest.sh) call it.
volume_health_gate() {
  local config=$1/kubelet-config.yaml.in
  ! grep -q '^featureGates:' "$config" ||
    { echo "kit's kubelet config has featureGates of its own: merge CSIVolumeHealth into them" >&2; return 1; }
  printf 'featureGates:\n  CSIVolumeHealth: true\n' >>"$config"
}

# netns_dir_shared: /run/netns a shared mount point of its own, as the first `ip netns
# add` on a machine makes it, before any pod's network namespace is mounted there.
# Made later (a guest cluster's first `ip netns add` while the host's cluster runs
# pods), its bind over itself leaves each pod namespace's mount under the bind:
# containerd then unmounts the copy on top and cannot remove the file (unlinkat:
# device or resource busy), and the pod never goes (a CI rehearsal lost 25 minutes of
# s11 to it). Both tests/cluster/run.sh and tests/vm/cluster.sh call this first.
netns_dir_shared() {
  mkdir -p /run/netns
  mountpoint -q /run/netns || mount --bind /run/netns /run/netns
  mount --make-shared /run/netns
}

# select_scenarios ARG...: sets `selected` to the scenarios of ALL (and EXTRA_SCENARIOS)
# the arguments name, by number or by name, in their order; to ALL without arguments.
# The callers take ALL and EXTRA_SCENARIOS from tests/plan.yaml (host_cluster,
# guest_cluster); this only resolves the names.
select_scenarios() {
  selected=()
  local arg s match
  for arg in "$@"; do
    match=""
    for s in "${ALL[@]}" ${EXTRA_SCENARIOS[@]+"${EXTRA_SCENARIOS[@]}"}; do
      case $s in "s${arg}_"*|"$arg"|"s$arg") match=$s ;; esac
    done
    [ -n "$match" ] || { echo "$0: unknown scenario $arg (one of ${ALL[*]})" >&2; exit 2; }
    selected+=("$match")
  done
  [ ${#selected[@]} -gt 0 ] || selected=("${ALL[@]}")
}
note() { printf '  [%(%T)T] %s\n' -1 "$*"; }
k() { kubectl "$@"; }

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every POLL_INTERVAL seconds (default
# half a second). WAIT_SCALE (default 1) multiplies every limit: tests/vm/cluster-guest.sh's
# emulated guest is slower, and polls every second there (its kubectl calls run on the
# host: tests/vm/kubectl-relay.sh).
wait_until() {
  local limit=$(( $1 * ${WAIT_SCALE:-1} )) what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    # Once more with its output, which may say what is missing.
    [ "$SECONDS" -lt "$end" ] || { "$@" || true; fail "timed out after ${limit}s waiting for: $what"; }
    pause "${POLL_INTERVAL:-0.5}"
  done
  note "$what"
}
# pause SECONDS: a sleep in the shell itself, a read with a timeout on a FIFO that
# nobody writes to: the emulated guest pays about 0.1 s of CPU for each process it
# starts, a sleep's too (tests/vm/README.md).
exec {PAUSE_FD}<> <(:)
pause() { read -r -t "$1" -u "$PAUSE_FD" _ || true; }

gone() { ! k get "$@" -o name >/dev/null 2>&1; }
pv_of() { k -n "$1" get pvc "$2" -o jsonpath='{.spec.volumeName}'; }

# A busybox pod (the kit's image, no pulls) that sleeps, or runs SCRIPT (sh) until
# stopped, with CLAIM's volume at PATH, or an emptyDir there (KIND emptydir, CLAIM "").
# Its sleep is one process an hour, not one a second: each costs the emulated guest.
# It shares the node's network: a pod network would only add the CNI plugins' runs
# (bridge, host-local; Go programs started twice a pod, each dear under TCG) to what is
# tested, the volume in the pod.
apply_pod() { # NAMESPACE NAME KIND(fs|block|emptydir) CLAIM [PATH] [SCRIPT]
  local ns=$1 name=$2 kind=$3 claim=$4 path=${5:-/data} script=${6:-'while true; do sleep 3600 & wait $!; done'}
  local mount source="persistentVolumeClaim: {claimName: $claim}"
  case $kind in
    fs) mount="volumeMounts: [{name: vol, mountPath: $path}]" ;;
    block) mount="volumeDevices: [{name: vol, devicePath: $path}]" ;;
    emptydir) mount="volumeMounts: [{name: vol, mountPath: $path}]" source="emptyDir: {}" ;;
    *) fail "apply_pod: kind $kind" ;;
  esac
  k apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: $ns}
spec:
  terminationGracePeriodSeconds: 1
  hostNetwork: true
  containers:
    - name: app
      image: localhost/busybox:1
      imagePullPolicy: Never
      command:
        - sh
        - -c
        - |
          trap 'exit 0' TERM; $script
      $mount
  volumes:
    - name: vol
      $source
YAML
}

apply_pvc() { # NAMESPACE NAME SIZE [CLASS] [MODE] [ANNOTATIONS-JSON]
  local ns=$1 name=$2 size=$3 class=${4:-$SC} mode=${5:-Filesystem} ann=${6:-"{}"}
  k apply -f - <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $name, namespace: $ns, annotations: $ann}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: $mode
  storageClassName: $class
  resources: {requests: {storage: $size}}
YAML
}

new_namespace() { k create namespace "$1" >/dev/null; note "namespace $1"; }

# Deletes a namespace and waits until its claims' volumes and backing files are gone.
delete_namespace() { # NAMESPACE
  local pvs; pvs=$(k get pvc -n "$1" -o jsonpath='{range .items[*]}{.spec.volumeName}{" "}{end}' 2>/dev/null || true)
  k delete namespace "$1" --wait=false >/dev/null 2>&1 || true
  wait_until 90 "namespace $1 deleted" gone namespace "$1"
  local pv
  for pv in $pvs; do wait_until 60 "volume $pv deleted" gone pv "$pv"; done
}

# One daemon pod of the DaemonSet, Ready.
daemon_pod() { k -n "$SYSTEM_NS" get pod -l app.kubernetes.io/component=node -o jsonpath='{.items[0].metadata.name}'; }
daemon_ready() {
  local ds ready desired updated pods
  ds=$(k -n "$SYSTEM_NS" get ds localvol-node -o jsonpath='{.status.numberReady} {.status.desiredNumberScheduled} {.status.updatedNumberScheduled} {.status.observedGeneration} {.metadata.generation}') || return 1
  read -r ready desired updated observed generation <<<"$ds"
  [ "$desired" -ge 1 ] && [ "$ready" = "$desired" ] && [ "$updated" = "$desired" ] && [ "$observed" = "$generation" ] ||
    return 1
  pods=$(k -n "$SYSTEM_NS" get pod -l app.kubernetes.io/component=node -o name) || return 1
  read -r -a pods -d '' <<<"$pods" || true
  [ "${#pods[@]}" = "$desired" ]
}

# The CSINode of this node lists localvol with its topology key.
registered() {
  [[ "$(k get csinode "$NODE" -o jsonpath="{.spec.drivers[?(@.name=='$DRIVER')].topologyKeys}")" == *topology.localvol.csi.dev/node* ]]
}

# LVs in the class's VG other than the thin pool (and its hidden sub-LVs).
volume_lvs() { lvs --noheadings -o lv_name "$LVM_VG" 2>/dev/null | awk -v pool="$THIN_POOL" '$1 != pool && $1 !~ /^\[/ {print $1}'; }

# ---- preparing a node: shared by run.sh (a node on this host) and tests/vm/cluster.sh
# (a node in a QEMU guest, whose root filesystem is this host's). Run from the repository.

# The runtime stage's root filesystem (packages, lvm.conf), cached under a name that
# depends only on the Dockerfile and on how runtime-stage.sh exports it (tests/all.sh
# makes it in its image step). Prints its path.
image_rootfs() { # CACHE_DIR LOG_DIR
  local rootfs; rootfs=$(tests/image/runtime-stage.sh --export-path "$1")
  if [ ! -s "$rootfs" ]; then
    echo "==== image root filesystem (tests/image/runtime-stage.sh, cached in $1)" >&2
    LOCALVOL_IMAGE_EXPORT=$rootfs tests/image/runtime-stage.sh "$1" >"$2/runtime-stage.log" 2>&1 ||
      { tail -20 "$2/runtime-stage.log" >&2; return 1; }
    find "$1" -maxdepth 1 -name 'runtime-*.tar' ! -path "$rootfs" -delete   # older versions
  fi
  echo "$rootfs"
}

# The node's Debian packages. Their services stay stopped: the recipe runs its own etcd
# and containerd.
# crun: the guest's node runs its containers with it (tests/vm/cluster-guest.sh).
NODE_PACKAGES=(containerd runc crun containernetworking-plugins busybox-static etcd-server
  curl openssl iproute2 iptables python3 xz-utils)
install_node_packages() { # LOG_DIR
  install_packages "$1" "${NODE_PACKAGES[@]}"
}
install_packages() { # LOG_DIR PACKAGE...: the Debian packages missing here, no service started
  local log=$1 missing=() p
  shift
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "==== packages: ${missing[*]}"
  local no_start=0 rc=0
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d; no_start=1; }
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; }
  } >"$log/apt.log" 2>&1 || rc=$?
  [ $no_start = 0 ] || rm -f /usr/sbin/policy-rc.d
  [ $rc = 0 ] || { tail -20 "$log/apt.log" >&2; return 1; }
}

# The VolumeSnapshot CRDs and the snapshot-controller (scenarios 9 and 11), on the host
# like the rest of the control plane, with the flag node-local drivers need
# (deploy/components/csi-snapshotter). KUBECONFIG is the cluster's admin one; sets
# SNAPSHOT_CONTROLLER_PID.
start_snapshot_controller() { # KIT_RECIPE_DIR LOG_DIR
  local crd
  for crd in volumesnapshotclasses volumesnapshotcontents volumesnapshots; do
    kubectl apply -f "$1/snapshot-crds/snapshot.storage.k8s.io_$crd.yaml" >>"$2/apply.log" &&
      kubectl wait --for=condition=established --timeout=60s "crd/$crd.snapshot.storage.k8s.io" >/dev/null ||
      { echo "the snapshot CRD $crd was not established" >&2; return 1; }
  done
  snapshot-controller --kubeconfig="$KUBECONFIG" --leader-election=false --enable-distributed-snapshotting \
    >"$2/snapshot-controller.log" 2>&1 &
  # shellcheck disable=SC2034  # the caller stops it (tests/cluster/run.sh, tests/vm/cluster.sh)
  SNAPSHOT_CONTROLLER_PID=$!
}

# The image archives a node needs: localvol's (ROOTFS plus BINARY, stripped of its debug
# info: 275 MB -> 60 MB, written, compressed and unpacked on every run) and the CSI
# sidecars under their upstream names, so that the manifests use them unchanged.
# Writes OUT_DIR/*.tar; import them (ctr images import) or copy them to
# $KUBE_KIT_STATE/images before start-node.sh.
build_image_archives() { # OUT_DIR BINARY ROOTFS RECIPE_DIR
  local out=$1 binary=$2 rootfs=$3 recipe=$4 entry
  entry=$(sed -n 's/^ENTRYPOINT \["\([^"]*\)"\]$/\1/p' Dockerfile)
  [ -n "$entry" ] || { echo "Dockerfile: no ENTRYPOINT [\"...\"]" >&2; return 1; }
  mkdir -p "$out"
  objcopy --strip-debug "$binary" "$out/localvol.bin"
  python3 "$recipe/mkimage.py" --name localhost/localvol:cluster-test --out "$out/localvol.tar" --base-tar "$rootfs" \
    --add "$out/localvol.bin:$entry" --entrypoint "[\"$entry\"]" --cmd '["serve"]' >/dev/null
  rm -f "$out/localvol.bin"
  local s
  for s in csi-provisioner:v5.3.0 csi-node-driver-registrar:v2.16.0 csi-resizer:v2.2.1 csi-snapshotter:v8.6.0; do
    python3 "$recipe/mkimage.py" --name "registry.k8s.io/sig-storage/$s" --out "$out/${s%%:*}.tar" \
      --add "$KUBE_KIT_BIN/${s%%:*}:/${s%%:*}" --entrypoint "[\"/${s%%:*}\"]" >/dev/null
  done
}
