# shellcheck shell=bash  # sourced, never run
# Part of scenario 9: pre-provisioned snapshots. A VolumeSnapshotContent made by hand for
# the handle of an existing snapshot, bound to a VolumeSnapshot of its own: made ready
# from ListSnapshots with the snapshot's size; with deletionPolicy Retain, deleting both
# leaves the snapshot on the node; with Delete, deleting the VolumeSnapshot deletes the
# content and the snapshot (lib.sh's snapshot_gone). Under distributed snapshotting the
# node's csi-snapshotter handles only contents labelled with its node (docs/backends.md,
# "Pre-provisioned snapshots"): the Retain and Delete contents of HANDLE are labelled by
# hand, which still works; a third content, for a second snapshot of SOURCE, is made
# without the label, and the daemon of the node holding the snapshot labels it.
s9_preprovisioned() { # NAMESPACE HANDLE TOKEN SOURCE
  local ns=$1 handle=$2 token=$3 policy name
  for policy in Retain Delete; do
    name=pre-${policy,,}
    s9_make_preprovisioned "$ns" "$name" "$handle" "$policy" "$NODE"
    wait_until 60 "pre-provisioned VolumeSnapshot $name ($policy) ready to use" s9_snapshot_ready "$ns" "$name"
    [ "$(k -n "$ns" get volumesnapshot "$name" -o jsonpath='{.status.restoreSize}')" = "$S9_SIZE" ] ||
      fail "$name: restoreSize $(k -n "$ns" get volumesnapshot "$name" -o jsonpath='{.status.restoreSize}'), expected $S9_SIZE"
    k -n "$ns" delete volumesnapshot "$name" --wait=true >/dev/null
    if [ "$policy" = Retain ]; then
      k get volumesnapshotcontent "$name-$ns" >/dev/null 2>&1 || fail "$name: a Retain content went with its VolumeSnapshot"
      k delete volumesnapshotcontent "$name-$ns" --wait=true >/dev/null
      snapshot_present "$token" || fail "$name: deleting a Retain content deleted snapshot $handle"
    else
      wait_until 60 "pre-provisioned content $name-$ns deleted" gone volumesnapshotcontent "$name-$ns"
      snapshot_gone "$token" || fail "$name: snapshot $handle left on the host after its Delete content went"
    fi
  done
  note "NOTE s9: pre-provisioned contents for $handle, labelled for $NODE: Retain kept the snapshot, Delete deleted it"
  s9_preprovisioned_unlabelled "$ns" "$4"
}

# A content made without the managed-by label, deletionPolicy Delete: the daemon labels it
# for this node, its csi-snapshotter makes it ready, and deleting its VolumeSnapshot
# deletes the snapshot. Its snapshot is made as Kubernetes' e2e suite makes one: a dynamic
# snapshot of SOURCE through a Retain class, whose VolumeSnapshot and content are then
# deleted, leaving only the snapshot on the node.
s9_preprovisioned_unlabelled() { # NAMESPACE SOURCE
  local ns=$1 name=pre-unlabelled content handle token label
  k apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata: {name: localvol-retain}
driver: localvol.csi.dev
deletionPolicy: Retain
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: snap-retained, namespace: $ns}
spec:
  volumeSnapshotClassName: localvol-retain
  source: {persistentVolumeClaimName: $2}
YAML
  wait_until 60 "VolumeSnapshot snap-retained (Retain class) ready to use" s9_snapshot_ready "$ns" snap-retained
  content=$(k -n "$ns" get volumesnapshot snap-retained -o jsonpath='{.status.boundVolumeSnapshotContentName}')
  handle=$(k get volumesnapshotcontent "$content" -o jsonpath='{.status.snapshotHandle}')
  token=${handle#snapshot.}; token=${token#*.}
  k -n "$ns" delete volumesnapshot snap-retained --wait=true >/dev/null
  k delete volumesnapshotcontent "$content" --wait=true >/dev/null
  k delete volumesnapshotclass localvol-retain >/dev/null
  snapshot_present "$token" || fail "deleting the Retain content $content deleted snapshot $handle"

  s9_make_preprovisioned "$ns" "$name" "$handle" Delete ""
  wait_until 60 "unlabelled pre-provisioned VolumeSnapshot $name ready to use" s9_snapshot_ready "$ns" "$name"
  label=$(k get volumesnapshotcontent "$name-$ns" -o jsonpath='{.metadata.labels.snapshot\.storage\.kubernetes\.io/managed-by}')
  [ "$label" = "$NODE" ] || fail "$name: content $name-$ns labelled managed-by=${label:-(none)}, expected $NODE"
  k -n "$SYSTEM_NS" logs "$(daemon_pod)" -c localvol | grep 'labelled pre-provisioned VolumeSnapshotContent' | grep -q "$name-$ns" ||
    fail "$name: the daemon's log does not say it labelled $name-$ns"
  [ "$(k -n "$ns" get volumesnapshot "$name" -o jsonpath='{.status.restoreSize}')" = "$S9_SIZE" ] ||
    fail "$name: restoreSize $(k -n "$ns" get volumesnapshot "$name" -o jsonpath='{.status.restoreSize}'), expected $S9_SIZE"
  k -n "$ns" delete volumesnapshot "$name" --wait=true >/dev/null
  wait_until 60 "pre-provisioned content $name-$ns deleted" gone volumesnapshotcontent "$name-$ns"
  snapshot_gone "$token" || fail "$name: snapshot $handle left on the host after its Delete content went"
  note "NOTE s9: pre-provisioned content for $handle made without a label: the daemon labelled it for $NODE, Delete deleted it"
}

# A VolumeSnapshotContent NAME-NAMESPACE made by hand for HANDLE with deletionPolicy
# POLICY, and the VolumeSnapshot NAME bound to it; the content is labelled managed-by
# NODE, or not at all when NODE is empty.
s9_make_preprovisioned() { # NAMESPACE NAME HANDLE POLICY NODE
  local ns=$1 name=$2 labels=""
  [ -z "$5" ] || labels="labels: {snapshot.storage.kubernetes.io/managed-by: $5}"
  k apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata:
  name: $name-$ns
  $labels
spec:
  deletionPolicy: $4
  driver: localvol.csi.dev
  source: {snapshotHandle: $3}
  volumeSnapshotClassName: localvol
  volumeSnapshotRef: {name: $name, namespace: $ns}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: $name, namespace: $ns}
spec:
  volumeSnapshotClassName: localvol
  source: {volumeSnapshotContentName: $name-$ns}
YAML
}
