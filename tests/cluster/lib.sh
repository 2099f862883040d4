# tests/cluster/lib.sh - helpers the scenarios share; sourced by run.sh.
# Every assertion fails the scenario with a message saying what was expected.

HOST_DATA_DIR=/var/lib/localvol
LOOP_DIR=$HOST_DATA_DIR/loop
DRIVER=localvol.csi.dev
NODE=${NODE_NAME:-node1}
SYSTEM_NS=localvol-system

fail() { echo "FAIL: $*" >&2; exit 1; }
note() { printf '  [%s] %s\n' "$(date +%T)" "$*"; }
k() { kubectl "$@"; }

# wait_until SECONDS WHAT COMMAND...: polls COMMAND every half second.
wait_until() {
  local limit=$1 what=$2; shift 2
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    # Once more with its output, which may say what is missing.
    [ "$SECONDS" -lt "$end" ] || { "$@" || true; fail "timed out after ${limit}s waiting for: $what"; }
    sleep 0.5
  done
  note "$what"
}

pod_phase_is() { [ "$(k -n "$1" get pod "$2" -o jsonpath='{.status.phase}')" = "$3" ]; }
gone() { ! k get "$@" -o name >/dev/null 2>&1; }
pvc_bound() { [ "$(k -n "$1" get pvc "$2" -o jsonpath='{.status.phase}')" = Bound ]; }
pv_of() { k -n "$1" get pvc "$2" -o jsonpath='{.spec.volumeName}'; }
handle_of() { k get pv "$1" -o jsonpath='{.spec.csi.volumeHandle}'; }
# The loop backing file of a volume handle (<class>.<token>).
backing_of() { echo "$LOOP_DIR/${1#*.}.img"; }
loop_of() { losetup -j "$1" -O NAME -n 2>/dev/null | head -1; }
# Mount table lines of a volume: its PV name in the mount point, or its loop device as
# the source (filesystem) or as the bind root (raw block, devtmpfs).
mounts_of() { # PV LOOPDEV
  local dev=${2:-/nonexistent}
  awk -v pv="$1" -v dev="$dev" -v root="/${dev#/dev/}" \
    'index($5, pv) || $4 == root || $0 ~ (" - [^ ]+ " dev " ") {print}' /proc/self/mountinfo
}
mounts_count() { mounts_of "$@" | wc -l; }

# A busybox pod (the kit's image, no pulls) that sleeps, or runs SCRIPT (sh) until
# stopped.
apply_pod() { # NAMESPACE NAME KIND(fs|block) CLAIM [PATH] [SCRIPT]
  local ns=$1 name=$2 kind=$3 claim=$4 path=${5:-/data} script=${6:-"while true; do sleep 1; done"}
  local mount
  case $kind in
    fs) mount="volumeMounts: [{name: vol, mountPath: $path}]" ;;
    block) mount="volumeDevices: [{name: vol, devicePath: $path}]" ;;
    *) fail "apply_pod: kind $kind" ;;
  esac
  k apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $name, namespace: $ns}
spec:
  terminationGracePeriodSeconds: 1
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
      persistentVolumeClaim: {claimName: $claim}
YAML
}

apply_pvc() { # NAMESPACE NAME SIZE [CLASS] [MODE] [ANNOTATIONS-JSON]
  local ns=$1 name=$2 size=$3 class=${4:-localvol-loop} mode=${5:-Filesystem} ann=${6:-"{}"}
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

# The volume of a claim as the API and the host see it; sets PV, HANDLE, BACKING, LOOP.
volume_facts() { # NAMESPACE PVC
  PV=$(pv_of "$1" "$2"); [ -n "$PV" ] || fail "claim $1/$2 has no volume"
  local node
  node=$(k get pv "$PV" -o jsonpath='{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}')
  [ "$node" = "$NODE" ] || fail "PV $PV pinned to node '$node', expected $NODE"
  [ "$(k get pv "$PV" -o jsonpath='{.spec.csi.driver}')" = "$DRIVER" ] || fail "PV $PV is not $DRIVER's"
  HANDLE=$(handle_of "$PV"); BACKING=$(backing_of "$HANDLE")
  [ -f "$BACKING" ] || fail "backing file $BACKING of $HANDLE missing on the host"
  LOOP=$(loop_of "$BACKING")
}

expect_mounted() { # PV LOOP MIN
  local n; n=$(mounts_count "$1" "$2")
  [ "$n" -ge "$3" ] || { mounts_of "$1" "$2" >&2; fail "volume $1 ($2): $n mounts on the host, expected at least $3"; }
  note "host: $n mount(s) of $1 on $2"
}

# released PV BACKING: no mount of the volume and no loop device on its file (a
# predicate for wait_until); expect_released fails the scenario instead.
released() {
  local loop; loop=$(loop_of "$2")
  [ "$(mounts_count "$1" "$loop")" -eq 0 ] && [ -z "$loop" ] && ! grep -q "$1" /proc/self/mountinfo && return 0
  echo "still there: loop device '${loop}' of $2; mounts:"; mounts_of "$1" "$loop"; losetup -a
  return 1
}
expect_released() {
  released "$1" "$2" || { mounts_of "$1" "$(loop_of "$2")" >&2; losetup -j "$2" >&2; fail "volume $1 still mounted or attached"; }
  note "host: $1 unmounted, $2 detached"
}

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
  local ds ready desired updated
  ds=$(k -n "$SYSTEM_NS" get ds localvol-node -o jsonpath='{.status.numberReady} {.status.desiredNumberScheduled} {.status.updatedNumberScheduled} {.status.observedGeneration} {.metadata.generation}') || return 1
  read -r ready desired updated observed generation <<<"$ds"
  [ "$desired" -ge 1 ] && [ "$ready" = "$desired" ] && [ "$updated" = "$desired" ] && [ "$observed" = "$generation" ] &&
    [ "$(k -n "$SYSTEM_NS" get pod -l app.kubernetes.io/component=node -o name | wc -l)" = "$desired" ]
}

# The CSINode of this node lists localvol with its topology key.
registered() {
  k get csinode "$NODE" -o jsonpath="{.spec.drivers[?(@.name=='$DRIVER')].topologyKeys}" | grep -q 'topology.localvol.csi.dev/node'
}

# The host PID of a container of a pod (containerd task).
container_pid() { # NAMESPACE POD CONTAINER
  local id
  id=$(k -n "$1" get pod "$2" -o jsonpath="{.status.containerStatuses[?(@.name=='$3')].containerID}")
  id=${id#containerd://}
  [ -n "$id" ] || return 1
  ctr --address "$KUBE_KIT_CRI_SOCK" -n k8s.io task ls | awk -v id="$id" '$1 == id {print $2}'
}

allocated_bytes() { echo $(( $(stat -c %b "$1") * $(stat -c %B "$1") )); }
