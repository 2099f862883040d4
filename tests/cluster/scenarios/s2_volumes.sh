# Scenario 2: a WaitForFirstConsumer claim and a pod, then a raw block claim and a pod:
# provisioned on this node, data written and read back, pod deleted -> unpublished and
# unstaged (no mount, no loop device), claim deleted -> volume and backing file gone.
s2_volumes() {
  local ns=lvtest-s2
  new_namespace $ns
  apply_pvc $ns fs 64Mi >/dev/null
  sleep 1
  [ "$(k -n $ns get pvc fs -o jsonpath='{.status.phase}')" = Pending ] || fail "a WaitForFirstConsumer claim bound before a pod used it"
  apply_pod $ns app fs fs >/dev/null
  wait_until 90 "pod with the filesystem claim Running" pod_phase_is $ns app Running
  volume_facts $ns fs
  note "PV $PV handle $HANDLE backing $BACKING on $LOOP"
  [ -n "$LOOP" ] || fail "no loop device attached to $BACKING"
  expect_mounted "$PV" "$LOOP" 2
  k -n $ns exec app -- sh -c 'echo cluster-data-s2 > /data/f && sync' || fail "writing into the volume"
  [ "$(k -n $ns exec app -- cat /data/f)" = cluster-data-s2 ] || fail "data read back differs"
  k -n $ns exec app -- sh -c 'grep " /data " /proc/mounts' | grep -q ' ext4 ' || fail "/data in the pod is not the ext4 volume"
  k -n $ns delete pod app --wait=true >/dev/null
  wait_until 60 "filesystem volume unpublished and unstaged" released "$PV" "$BACKING"
  [ -f "$BACKING" ] || fail "backing file gone while the claim exists"
  k -n $ns delete pvc fs --wait=true >/dev/null
  wait_until 60 "PV $PV deleted" gone pv "$PV"
  [ ! -e "$BACKING" ] || fail "backing file $BACKING left after the volume was deleted"
  note "filesystem claim: backing file removed"

  apply_pvc $ns raw 32Mi localvol-loop Block >/dev/null
  apply_pod $ns rawapp block raw /dev/xvda >/dev/null
  wait_until 90 "pod with the raw block claim Running" pod_phase_is $ns rawapp Running
  volume_facts $ns raw
  [ -n "$LOOP" ] || fail "no loop device attached to $BACKING"
  expect_mounted "$PV" "$LOOP" 1
  k -n $ns exec rawapp -- sh -c 'echo raw-data-s2 | dd of=/dev/xvda bs=512 count=1 conv=sync,fsync 2>/dev/null' || fail "writing the block device"
  [ "$(k -n $ns exec rawapp -- sh -c 'dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -1')" = raw-data-s2 ] ||
    fail "block data read back differs"
  [ "$(head -c 11 "$BACKING")" = raw-data-s2 ] || fail "the pod's block write is not in the backing file"
  k -n $ns delete pod rawapp --wait=true >/dev/null
  wait_until 60 "raw block volume unpublished and unstaged" released "$PV" "$BACKING"
  k -n $ns delete pvc raw --wait=true >/dev/null
  wait_until 60 "PV $PV deleted" gone pv "$PV"
  [ ! -e "$BACKING" ] || fail "backing file $BACKING left after the volume was deleted"
  delete_namespace $ns
}
