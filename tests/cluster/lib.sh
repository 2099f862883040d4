# shellcheck shell=bash  # sourced, never run
# tests/cluster/lib.sh - helpers the scenarios share; sourced by run.sh.
# Every assertion fails the scenario with a message saying what was expected.

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

pod_phase_is() { [ "$(k -n "$1" get pod "$2" -o jsonpath='{.status.phase}')" = "$3" ]; }
# pods_running NAMESPACE POD...: every one of them Running, in one read of the API and
# no other process (polls cost most on the emulated guest).
pods_running() {
  local ns=$1 phase n=0; shift
  for phase in $(k -n "$ns" get pod "$@" -o custom-columns=PHASE:.status.phase --no-headers); do
    [ "$phase" != Running ] || n=$((n + 1))
  done
  [ $n = $# ]
}
claim_phase_is() { [ "$(k -n "$1" get pvc "$2" -o jsonpath='{.status.phase}')" = "$3" ]; }
gone() { ! k get "$@" -o name >/dev/null 2>&1; }
pvc_bound() { [ "$(k -n "$1" get pvc "$2" -o jsonpath='{.status.phase}')" = Bound ]; }
pv_of() { k -n "$1" get pvc "$2" -o jsonpath='{.spec.volumeName}'; }
handle_of() { k get pv "$1" -o jsonpath='{.spec.csi.volumeHandle}'; }
# The loop backing file of a volume handle (<class>.<token>).
backing_of() { echo "$LOOP_DIR/${1#*.}.img"; }
loop_of() { losetup -j "$1" -O NAME -n 2>/dev/null | head -1; }

# What backs a volume on the host, per CLASS_KIND. BACKING names it: the loop backing
# file, or VG/LV for the lvm classes. DEV is its block device while there is one (the
# loop device attached to the file, the LV's /dev/mapper node).
# The LV of a handle: named by the token (src/backend/lvm/tags.rs), or a hashed name
# carrying the token in its tags when the token cannot be an LV name.
lv_of() { # HANDLE
  local token=${1#*.} name
  if lvs "$LVM_VG/$token" >/dev/null 2>&1; then echo "$LVM_VG/$token"; return; fi
  name=$(lvs --noheadings -o lv_name,lv_tags "$LVM_VG" 2>/dev/null | awk -v t="$token" 'index($2, t) {print $1; exit}')
  [ -n "$name" ] && echo "$LVM_VG/$name"
}
# A field of the fsdax namespace NAME (ndctl list prints a lone object for one result).
# Only a namespace that holds storage counts: the kernel leaves a destroyed namespace as
# the region's idle seed (raw, size 0) with its label's name (src/backend/pmem/ndctl.rs,
# is_idle_seed), so the name alone would find a deleted volume.
pmem_field() { # NAME FIELD
  ndctl list -N -i 2>/dev/null | python3 -c 'import json, sys
d = sys.stdin.read().strip()
v = json.loads(d) if d else []
for n in v if isinstance(v, list) else [v]:
    if n.get("name") == sys.argv[1] and n.get("mode") == "fsdax" and n.get("size", 0):
        print(n.get(sys.argv[2], "")); break' "$1" "$2"
}
dm_path_of() { # VG/LV: its /dev/mapper node (VG-LV, each '-' doubled)
  local vg=${1%%/*} lv=${1#*/}
  echo "/dev/mapper/${vg//-/--}-${lv//-/--}"
}
backing_for() { # HANDLE
  case $CLASS_KIND in
    loop) backing_of "$1" ;;
    lvm|lvm-thin|pmem-lvm) lv_of "$1" || echo "$LVM_VG/${1#*.}" ;;
    # The namespace's name is the token (src/backend/pmem/mod.rs: namespace_name).
    pmem) echo "${1#*.}" ;;
    *) fail "backing_for: class kind $CLASS_KIND" ;;
  esac
}
backing_present() { # BACKING
  case $CLASS_KIND in
    loop) [ -f "$1" ] ;;
    lvm|lvm-thin|pmem-lvm) lvs "$1" >/dev/null 2>&1 ;;
    pmem) [ -n "$(pmem_field "$1" dev)" ] ;;
  esac
}
# The volume's storage is gone: for LVM also no device-mapper device of it.
backing_gone() { # BACKING
  case $CLASS_KIND in
    loop) [ ! -e "$1" ] ;;
    lvm|lvm-thin|pmem-lvm) ! lvs "$1" >/dev/null 2>&1 && ! dmsetup info "$(basename "$(dm_path_of "$1")")" >/dev/null 2>&1 &&
      [ ! -e "$(dm_path_of "$1")" ] ;;
    pmem) [ -z "$(pmem_field "$1" dev)" ] ;;
  esac
}
# The block device of the volume now, or nothing.
device_of() { # BACKING
  case $CLASS_KIND in
    loop) loop_of "$1" ;;
    lvm|lvm-thin|pmem-lvm) local d; d=$(dm_path_of "$1"); [ -b "$d" ] && echo "$d" ;;
    pmem) local b; b=$(pmem_field "$1" blockdev); [ -n "$b" ] && [ -b "/dev/$b" ] && echo "/dev/$b" ;;
  esac
}
# Still attached after its last unstage? (A loop device is detached at unstage; an LV
# stays as it is until the volume is deleted.)
still_attached() { # BACKING
  case $CLASS_KIND in
    loop) loop_of "$1" ;;
    *) true ;;
  esac
}
read_backing() { # BACKING BYTES: the first bytes of the volume, read on the host
  case $CLASS_KIND in
    loop) head -c "$2" "$1" ;;
    lvm|lvm-thin|pmem-lvm) head -c "$2" "$(dm_path_of "$1")" ;;
    pmem) head -c "$2" "$(device_of "$1")" ;;
  esac
}
backing_bytes() { # BACKING: the volume's size on the host
  case $CLASS_KIND in
    loop) stat -c %s "$1" ;;
    lvm|lvm-thin|pmem-lvm) lvs --noheadings --units b --nosuffix -o lv_size "$1" | tr -d ' ' ;;
    pmem) pmem_field "$1" size ;;
  esac
}
describe_backing() { # BACKING, for failure messages
  case $CLASS_KIND in
    loop) echo "backing file $1" ;;
    pmem) echo "fsdax namespace $1" ;;
    *) echo "LV $1" ;;
  esac
}

# major:minor of a block device ("" if none).
majmin() { [ -b "${1:-}" ] && echo "$(( 0x$(stat -L -c %t "$1") )):$(( 0x$(stat -L -c %T "$1") ))"; }
# major:minor of the device node PATH in a pod.
pod_dev_majmin() { # NAMESPACE POD PATH
  local t; t=$(k -n "$1" exec "$2" -- stat -c '%t %T' "$3") || return 1
  set -- $t; echo "$(( 0x$1 )):$(( 0x$2 ))"
}
# Mount table lines of a volume: its PV name in the mount point, or its device as the
# source (filesystem: by path or by major:minor) or as the bind root (raw block, devtmpfs).
mounts_of() { # PV DEV
  local dev=${2:-/nonexistent} mm="" real=/nonexistent
  if [ -b "$dev" ]; then mm=$(majmin "$dev"); real=$(realpath "$dev"); fi
  awk -v pv="$1" -v dev="$dev" -v root="/${dev#/dev/}" -v rroot="/${real#/dev/}" -v mm="$mm" \
    'index($5, pv) || $4 == root || $4 == rroot || (mm != "" && $3 == mm) || $0 ~ (" - [^ ]+ " dev " ") {print}' /proc/self/mountinfo
}
mounts_count() { mounts_of "$@" | wc -l; }

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

# A WaitForFirstConsumer StorageClass of the run's device class with FSTYPE (labelled
# lvtest, as the scenarios' other objects are named, to tell it from the overlay's).
apply_storage_class() { # NAME FSTYPE ALLOW-EXPANSION(true|false)
  k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $1, labels: {lvtest: "1"}}
provisioner: $DRIVER
parameters:
  localvol.csi.dev/device-class: $DEVICE_CLASS
  csi.storage.k8s.io/fstype: $2
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: $3
YAML
}

new_namespace() { k create namespace "$1" >/dev/null; note "namespace $1"; }

# The volume of a claim as the API and the host see it; sets PV, HANDLE, BACKING and DEV
# (see backing_for, device_of); LOOP is DEV (the loop device for the loop class).
volume_facts() { # NAMESPACE PVC
  PV=$(pv_of "$1" "$2"); [ -n "$PV" ] || fail "claim $1/$2 has no volume"
  local node
  node=$(k get pv "$PV" -o jsonpath='{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}')
  [ "$node" = "$NODE" ] || fail "PV $PV pinned to node '$node', expected $NODE"
  [ "$(k get pv "$PV" -o jsonpath='{.spec.csi.driver}')" = "$DRIVER" ] || fail "PV $PV is not $DRIVER's"
  HANDLE=$(handle_of "$PV"); BACKING=$(backing_for "$HANDLE")
  backing_present "$BACKING" || fail "$(describe_backing "$BACKING") of $HANDLE missing on the host"
  DEV=$(device_of "$BACKING")
}

# The volume is the device this class makes: a loop device, or a device-mapper LV (its
# /dev/mapper node, major the device-mapper's) for the lvm classes.
expect_class_device() { # NONE (uses DEV, BACKING)
  [ -n "$DEV" ] || fail "no block device of $(describe_backing "$BACKING")"
  case $CLASS_KIND in
    loop) [[ $DEV == /dev/loop* ]] || fail "$DEV is not a loop device" ;;
    lvm|lvm-thin|pmem-lvm)
      local dm; dm=$(awk '$2 == "device-mapper" {print $1}' /proc/devices)
      [ "${DEV#/dev/mapper/}" != "$DEV" ] && [ "$(majmin "$DEV")" != "" ] && [ "$(majmin "$DEV" | cut -d: -f1)" = "$dm" ] ||
        fail "$DEV of $BACKING is not a device-mapper device (major $dm)"
      if [ "$CLASS_KIND" = lvm-thin ]; then
        [ "$(lvs --noheadings -o segtype "$BACKING" | tr -d ' ')" = thin ] || fail "$BACKING is not a thin LV"
      fi
      # pmem in lvm mode: the LV lies on the VG's fsdax namespaces.
      if [ "$CLASS_KIND" = pmem-lvm ]; then
        local pvs; pvs=$(lvs --noheadings -o devices "$BACKING" | tr -d ' ')
        [[ $pvs == /dev/pmem* ]] || fail "$BACKING lies on $pvs, not on a pmem device"
      fi ;;
    pmem) [[ $DEV == /dev/pmem* ]] || fail "$DEV is not a pmem device"
      [ "$(pmem_field "$BACKING" mode)" = fsdax ] || fail "namespace $BACKING is not fsdax" ;;
  esac
  note "host: $(describe_backing "$BACKING") is $DEV ($(majmin "$DEV"))"
}
# The filesystem a pod sees at PATH is the volume: its fstype, and the major:minor of
# its device is DEV's (the mount source string is printed, whatever alias it uses).
expect_pod_mount() { # NAMESPACE POD PATH
  local line; line=$(k -n "$1" exec "$2" -- cat /proc/self/mountinfo | awk -v p="$3" '$5 == p')
  [ -n "$line" ] || fail "no mount at $3 in pod $2"
  local mm fs src; mm=$(awk '{print $3}' <<<"$line")
  fs=$(sed 's/.* - //' <<<"$line" | awk '{print $1}'); src=$(sed 's/.* - //' <<<"$line" | awk '{print $2}')
  [ "$fs" = "$FSTYPE" ] || fail "$3 in pod $2 is $fs, expected $FSTYPE"
  [ "$mm" = "$(majmin "$DEV")" ] || fail "$3 in pod $2 is device $mm ($src), not $DEV ($(majmin "$DEV"))"
  case $CLASS_KIND in
    lvm|lvm-thin|pmem-lvm) [[ $src == /dev/mapper/* || $src == /dev/dm-* || $src == /dev/$LVM_VG/* ]] ||
      fail "$3 in pod $2: mount source $src is not a device-mapper LV path"
      # deploy/overlays/pmem-lvm mounts with -o dax, as pmem direct does.
      [ "$CLASS_KIND" != pmem-lvm ] || grep -qw 'dax' <<<"$line" ||
        fail "$3 in pod $2 is not mounted with dax: $line" ;;
    # deploy/overlays/pmem mounts with -o dax.
    pmem) [[ $src == /dev/pmem* ]] || fail "$3 in pod $2: mount source $src is not a pmem device"
      grep -qw 'dax' <<<"$line" ||
        fail "$3 in pod $2 is not mounted with dax: $line" ;;
  esac
  note "pod $2: $3 is $fs on $src ($mm)"
}

expect_mounted() { # PV LOOP MIN
  local n; n=$(mounts_count "$1" "$2")
  [ "$n" -ge "$3" ] || { mounts_of "$1" "$2" >&2; fail "volume $1 ($2): $n mounts on the host, expected at least $3"; }
  note "host: $n mount(s) of $1 on $2"
}

# released PV BACKING: no mount of the volume and, for the loop class, no loop device on
# its file (a predicate for wait_until); expect_released fails the scenario instead.
released() {
  local dev attached; dev=$(device_of "$2"); attached=$(still_attached "$2")
  [ "$(mounts_count "$1" "$dev")" -eq 0 ] && [ -z "$attached" ] && ! grep -q "$1" /proc/self/mountinfo && return 0
  echo "still there: device '${attached}' of $2; mounts:"; mounts_of "$1" "$dev"
  [ "$CLASS_KIND" = loop ] && losetup -a
  return 1
}
expect_released() {
  released "$1" "$2" >&2 || fail "volume $1 still mounted or attached"
  note "host: $1 unmounted, $2 released"
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
  local ds ready desired updated pods
  ds=$(k -n "$SYSTEM_NS" get ds localvol-node -o jsonpath='{.status.numberReady} {.status.desiredNumberScheduled} {.status.updatedNumberScheduled} {.status.observedGeneration} {.metadata.generation}') || return 1
  read -r ready desired updated observed generation <<<"$ds"
  [ "$desired" -ge 1 ] && [ "$ready" = "$desired" ] && [ "$updated" = "$desired" ] && [ "$observed" = "$generation" ] ||
    return 1
  pods=$(k -n "$SYSTEM_NS" get pod -l app.kubernetes.io/component=node -o name) || return 1
  read -r -a pods -d '' <<<"$pods" || true
  [ "${#pods[@]}" = "$desired" ]
}
# The daemon pod OLD replaced by a new one, Ready (scenario 14's upgrade and rollback).
daemon_replaced() { local p; p=$(daemon_pod); [ -n "$p" ] && [ "$p" != "$1" ] && daemon_ready; }

# The CSINode of this node lists localvol with its topology key.
registered() {
  [[ "$(k get csinode "$NODE" -o jsonpath="{.spec.drivers[?(@.name=='$DRIVER')].topologyKeys}")" == *topology.localvol.csi.dev/node* ]]
}

allocated_bytes() { echo $(( $(stat -c %b "$1") * $(stat -c %B "$1") )); }

# What the volume's data takes on the host, for the classes that give back what a trim
# frees: the backing file's allocated blocks (loop), the thin LV's mapped share of its
# size (lvm-thin, data_percent).
used_bytes() { # BACKING
  case $CLASS_KIND in
    loop) allocated_bytes "$1" ;;
    lvm-thin) lvs --noheadings --units b --nosuffix -o lv_size,data_percent "$1" | awk '{printf "%d\n", $1 * $2 / 100}' ;;
    *) fail "used_bytes: a $CLASS_KIND volume has no space a trim gives back" ;;
  esac
}
# The thin pool of the lvm-thin overlays (deploy/overlays/lvm-thin/config.yaml).
THIN_POOL=${THIN_POOL:-pool0}
pool_data_percent() { lvs --noheadings -o data_percent "$LVM_VG/$THIN_POOL" | tr -d ' '; }

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
