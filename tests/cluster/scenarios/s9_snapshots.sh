# shellcheck shell=bash  # sourced, never run
# Scenario 9: VolumeSnapshots and clones of a claim that a running pod writes to, with
# csi-snapshotter as a node sidecar (deploy/components/csi-snapshotter) and the
# snapshot-controller started with --enable-distributed-snapshotting (run.sh on the
# host, tests/vm/cluster-guest.sh in the guest): a restore holds the data as at the
# snapshot and a clone as at the clone, not what came after; deleting everything leaves
# no VolumeSnapshotContent and nothing of the class's on the node (class_storage_left:
# the loop class's images and records, lvm-thin's volume and snapshot LVs).
# On the loop class the scenario adds the component (overlays/snapshots) and takes it
# away after; the guest's lvm-thin overlay carries it from the start.
# Contents made by hand for the snapshot, one Retain and one Delete, are served too, and
# one made without the managed-by label for a second snapshot, which the daemon labels
# (s9_preprovisioned.sh).

s9_snapshots() {
  local ns=lvtest-s9
  if [ "$CLASS_KIND" = loop ]; then
    k apply -k "$HERE/overlays/snapshots" >/dev/null
    # Back to the run's overlay even when a step fails, so later scenarios see it.
    trap s9_restore EXIT
    wait_until 120 "DaemonSet with the csi-snapshotter sidecar rolled out" k -n "$SYSTEM_NS" rollout status ds/localvol-node --timeout=5s
  else
    trap s9_delete_snapshots EXIT
  fi
  wait_until 30 "csi-snapshotter sidecar ready" s9_sidecar_ready
  # The source's size; a restore asks for twice as much.
  S9_SIZE=$FS_SIZE
  local double=$(( ${S9_SIZE%Mi} * 2 ))Mi
  new_namespace $ns

  # The source: a pod appends a numbered line every 50 ms for as long as it runs, so the
  # snapshot and the clone are taken under writes.
  apply_pvc $ns src "$S9_SIZE" >/dev/null
  apply_pod $ns writer fs src /data 'i=0; while true; do i=$((i+1)); echo "line $i" >> /data/log; sleep 0.05; done' >/dev/null
  wait_until 90 "writer pod Running" pod_phase_is $ns writer Running
  volume_facts $ns src
  S9_SOURCE_BACKING=$BACKING
  k -n $ns exec writer -- sh -c 'echo before-snapshot > /data/marker-1 && sync' || fail "writing into the source"
  wait_until 10 "the writer is writing" s9_lines_at_least $ns writer 5
  local lines_before_snapshot; lines_before_snapshot=$(s9_lines $ns writer)
  local src_kib restored_kib

  k apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap, namespace: $ns}
spec:
  volumeSnapshotClassName: localvol
  source: {persistentVolumeClaimName: src}
YAML
  wait_until 60 "VolumeSnapshot ready to use" s9_snapshot_ready $ns snap
  # Every line the snapshot can hold was written before it was ready.
  local lines_at_ready; lines_at_ready=$(s9_lines $ns writer)
  k -n $ns exec writer -- sh -c 'echo after-snapshot > /data/marker-2 && sync' || fail "writing after the snapshot"
  local content handle token
  content=$(k -n $ns get volumesnapshot snap -o jsonpath='{.status.boundVolumeSnapshotContentName}')
  handle=$(k get volumesnapshotcontent "$content" -o jsonpath='{.status.snapshotHandle}')
  token=${handle#snapshot.}; token=${token#*.}
  note "snapshot content $content handle $handle"
  [ "$(k get volumesnapshotcontent "$content" -o jsonpath='{.metadata.labels.snapshot\.storage\.kubernetes\.io/managed-by}')" = "$NODE" ] ||
    fail "content $content not labelled for node $NODE (snapshot-controller without --enable-distributed-snapshotting?)"
  snapshot_present "$token" || { class_storage_left >&2; fail "snapshot $handle missing on the host"; }
  [ "$(k -n $ns get volumesnapshot snap -o jsonpath='{.status.restoreSize}')" = "$S9_SIZE" ] ||
    fail "restoreSize $(k -n $ns get volumesnapshot snap -o jsonpath='{.status.restoreSize}'), expected $S9_SIZE"

  # Restore into a claim twice the snapshot's size: the data as at the snapshot, and the
  # pod sees the size it asked for (the filesystem grown at stage), not the source's.
  s9_pvc_from $ns restored VolumeSnapshot snap snapshot.storage.k8s.io "$double" >/dev/null
  apply_pod $ns restore-reader fs restored >/dev/null
  wait_until 90 "pod on the restored claim Running" pod_phase_is $ns restore-reader Running
  s9_copy_holds $ns restore-reader restored restore marker-1 before-snapshot marker-2 "$lines_before_snapshot" "$lines_at_ready"
  src_kib=$(s9_df_kib $ns writer) restored_kib=$(s9_df_kib $ns restore-reader)
  # The filesystem keeps a few MiB of either size for itself: twice the size, less 10%.
  [ "$restored_kib" -gt $((src_kib * 9 / 5)) ] ||
    fail "the $double restore shows ${restored_kib} KiB in the pod, the $S9_SIZE source ${src_kib} KiB: its filesystem was not grown"

  # Clone of the running source: the data as at the clone.
  local lines_before_clone; lines_before_clone=$(s9_lines $ns writer)
  s9_pvc_from $ns clone PersistentVolumeClaim src "" "$S9_SIZE" >/dev/null
  apply_pod $ns clone-reader fs clone >/dev/null
  wait_until 90 "pod on the clone Running" pod_phase_is $ns clone-reader Running
  local lines_at_clone; lines_at_clone=$(s9_lines $ns writer)
  k -n $ns exec writer -- sh -c 'echo after-clone > /data/marker-3 && sync' || fail "writing after the clone"
  s9_copy_holds $ns clone-reader clone clone marker-2 after-snapshot marker-3 "$lines_before_clone" "$lines_at_clone"
  # The source kept running and writing through both copies.
  local before; before=$(s9_lines $ns writer)
  wait_until 10 "the writer still writes after the copies" s9_lines_at_least $ns writer $((before + 5))

  # Contents made by hand for the same snapshot (s9_preprovisioned.sh); the last one
  # deletes it, so deleting the dynamic VolumeSnapshot below finds nothing to delete.
  s9_preprovisioned $ns "$handle" "$token" src

  # Delete everything: the snapshot first (its content and copy go with it), then the
  # pods and claims.
  k -n $ns delete volumesnapshot snap --wait=true >/dev/null
  wait_until 60 "VolumeSnapshotContent $content deleted" gone volumesnapshotcontent "$content"
  snapshot_gone "$token" || fail "snapshot $handle left on the host"
  delete_namespace $ns
  [ -z "$(k get volumesnapshotcontent -o name)" ] || fail "VolumeSnapshotContents left: $(k get volumesnapshotcontent -o name)"
  local left; left=$(class_storage_left)
  [ -z "$left" ] || fail "left of the $DEVICE_CLASS class on the node: $left"
  note "NOTE s9 ($DEVICE_CLASS): restore holds $(s9_restored_lines) of the $lines_at_ready lines written when the snapshot was ready; df in its pod ${restored_kib} KiB ($double claim; the $S9_SIZE source ${src_kib} KiB); nothing of the class left on the node"
}

# The sidecar deletes the snapshots' copies: a step that failed left VolumeSnapshots
# behind, so they go while it still runs.
s9_delete_snapshots() {
  k delete volumesnapshot --all --all-namespaces --wait=false >/dev/null 2>&1 || true
  local end=$((SECONDS + 60))
  while [ $SECONDS -lt $end ] && [ -n "$(k get volumesnapshotcontent -o name 2>/dev/null)" ]; do sleep 0.5; done
}
s9_restore() {
  s9_delete_snapshots
  k apply -k "$OVERLAY" >/dev/null
  k delete --ignore-not-found -f "$REPO/deploy/components/csi-snapshotter/rbac.yaml" >/dev/null
  k delete --ignore-not-found volumesnapshotclass localvol localvol-retain >/dev/null
  wait_until 120 "DaemonSet back to the $REGISTRATION overlay" k -n "$SYSTEM_NS" rollout status ds/localvol-node --timeout=5s
}

s9_sidecar_ready() {
  local pod; pod=$(daemon_pod)
  [ "$(k -n "$SYSTEM_NS" get pod "$pod" -o jsonpath="{.status.containerStatuses[?(@.name=='csi-snapshotter')].ready}")" = true ]
}

s9_pvc_from() { # NAMESPACE NAME KIND SOURCE APIGROUP SIZE
  local group="" size=$6
  [ -z "$5" ] || group="apiGroup: $5, "
  k apply -f - <<YAML
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $2, namespace: $1}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: $SC
  dataSource: {${group}kind: $3, name: $4}
  resources: {requests: {storage: $size}}
YAML
}

# The size of the filesystem at /data in POD, in KiB, as df shows it (-P: one line, even
# when the device's name is long, as an LV's /dev/mapper name is).
s9_df_kib() { # NAMESPACE POD
  k -n "$1" exec "$2" -- df -P -k /data | awk 'NR == 2 {print $2}'
}

# A copy read by POD: another volume than the source, FILE holds CONTENT (written before
# the copy), AFTER (written after it) is missing, and its log is intact.
s9_copy_holds() { # NAMESPACE POD CLAIM WHAT FILE CONTENT AFTER MIN-LINES MAX-LINES
  local ns=$1 pod=$2 what=$4
  volume_facts "$ns" "$3"
  [ "$BACKING" != "$S9_SOURCE_BACKING" ] || fail "the $what is the source volume"
  [ "$(k -n "$ns" exec "$pod" -- cat "/data/$5")" = "$6" ] || fail "the $what lacks what was written before it"
  k -n "$ns" exec "$pod" -- test -e "/data/$7" && fail "the $what holds what was written after it"
  s9_log_intact "$ns" "$pod" "$8" "$9" "$what"
}

s9_snapshot_ready() { [ "$(k -n "$1" get volumesnapshot "$2" -o jsonpath='{.status.readyToUse}')" = true ]; }
s9_lines() { k -n "$1" exec "$2" -- sh -c 'wc -l < /data/log'; }
s9_lines_at_least() { [ "$(s9_lines "$1" "$2")" -ge "$3" ]; }

# The copy's log is the source's as it was: lines 1..n in order, none torn, n no more
# than the source had when the copy was done, and no fewer than before the copy began.
s9_log_intact() { # NAMESPACE POD MIN MAX WHAT
  local log; log=$(k -n "$1" exec "$2" -- cat /data/log)
  local n; n=$(wc -l <<<"$log")
  [ "$n" -ge "$3" ] && [ "$n" -le "$4" ] || fail "the $5's log has $n lines, expected $3..$4"
  [ "$log" = "$(seq 1 "$n" | sed 's/^/line /')" ] || fail "the $5's log is not lines 1..$n in order: $(head -c 300 <<<"$log")"
  [ "$5" != restore ] || S9_RESTORED_LINES=$n
  note "$5: log lines 1..$n intact (source had $3 before the copy began, $4 when it was done)"
}
s9_restored_lines() { echo "${S9_RESTORED_LINES:-?}"; }
