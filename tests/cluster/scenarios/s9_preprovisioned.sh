# Part of scenario 9: pre-provisioned snapshots. A VolumeSnapshotContent made by hand for
# the handle of an existing snapshot, labelled for this node (docs/backends.md,
# "Pre-provisioned snapshots": under distributed snapshotting the node's csi-snapshotter
# handles only contents with its node's label), bound to a VolumeSnapshot of its own:
# made ready from ListSnapshots with the snapshot's size; with deletionPolicy Retain,
# deleting both leaves the snapshot on the node; with Delete, deleting the VolumeSnapshot
# deletes the content and the snapshot's image and record.
s9_preprovisioned() { # NAMESPACE HANDLE TOKEN
  local ns=$1 handle=$2 token=$3 policy name
  for policy in Retain Delete; do
    name=pre-${policy,,}
    k apply -f - >/dev/null <<YAML
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata:
  name: $name-$ns
  labels: {snapshot.storage.kubernetes.io/managed-by: $NODE}
spec:
  deletionPolicy: $policy
  driver: localvol.csi.dev
  source: {snapshotHandle: $handle}
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
    wait_until 60 "pre-provisioned VolumeSnapshot $name ($policy) ready to use" s9_snapshot_ready "$ns" "$name"
    [ "$(k -n "$ns" get volumesnapshot "$name" -o jsonpath='{.status.restoreSize}')" = 64Mi ] ||
      fail "$name: restoreSize $(k -n "$ns" get volumesnapshot "$name" -o jsonpath='{.status.restoreSize}'), expected 64Mi"
    k -n "$ns" delete volumesnapshot "$name" --wait=true >/dev/null
    if [ "$policy" = Retain ]; then
      k get volumesnapshotcontent "$name-$ns" >/dev/null 2>&1 || fail "$name: a Retain content went with its VolumeSnapshot"
      k delete volumesnapshotcontent "$name-$ns" --wait=true >/dev/null
      [ -f "$S9_SNAPSHOTS/$token.img" ] && [ -f "$S9_SNAPSHOTS/$token.json" ] ||
        fail "$name: deleting a Retain content deleted snapshot $handle"
    else
      wait_until 60 "pre-provisioned content $name-$ns deleted" gone volumesnapshotcontent "$name-$ns"
      [ ! -e "$S9_SNAPSHOTS/$token.img" ] && [ ! -e "$S9_SNAPSHOTS/$token.json" ] ||
        fail "$name: snapshot $handle left on the host after its Delete content went"
    fi
  done
  note "NOTE s9: pre-provisioned contents for $handle, labelled for $NODE: Retain kept the snapshot, Delete deleted it"
}
