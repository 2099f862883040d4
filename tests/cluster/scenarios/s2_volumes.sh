# Scenario 2: a WaitForFirstConsumer claim and a pod, on the class's filesystem and then
# on the other one of ext4 and xfs (a StorageClass's fstype parameter), then a raw block
# claim and a pod:
# provisioned on this node, data written and read back, pod deleted -> unpublished and
# unstaged (no mount, no loop device), claim deleted -> volume and backing file gone.
# For the class of lib.sh's CLASS_KIND (loop: backing files; lvm, lvm-thin: LVs, whose
# device-mapper device the pod's mount must be). On loop (the host suite) also a claim of
# an Immediate class, which does not depend on the backend (s2_immediate).
s2_volumes() {
  local ns=lvtest-s2
  new_namespace $ns
  apply_pvc $ns fs "$FS_SIZE" >/dev/null
  sleep 1
  [ "$(k -n $ns get pvc fs -o jsonpath='{.status.phase}')" = Pending ] || fail "a WaitForFirstConsumer claim bound before a pod used it"
  s2_filesystem $ns fs
  # The class's other filesystem, through the StorageClass parameter that picks it.
  local other=xfs size=320Mi   # mkfs.xfs refuses below 300 MB (tests/vm/README.md)
  [ "$FSTYPE" = xfs ] && other=ext4 size=$FS_SIZE
  apply_storage_class "lvtest-s2-$other" $other false
  apply_pvc $ns "fs-$other" $size "lvtest-s2-$other" >/dev/null
  FSTYPE=$other s2_filesystem $ns "fs-$other"
  k delete storageclass "lvtest-s2-$other" >/dev/null

  apply_pvc $ns raw "$BLOCK_SIZE" "$SC" Block >/dev/null
  apply_pod $ns rawapp block raw /dev/xvda >/dev/null
  wait_until 90 "pod with the raw block claim Running" pod_phase_is $ns rawapp Running
  volume_facts $ns raw
  expect_class_device
  expect_mounted "$PV" "$DEV" 1
  [ "$(pod_dev_majmin $ns rawapp /dev/xvda)" = "$(majmin "$DEV")" ] ||
    fail "/dev/xvda in the pod is not $DEV ($(majmin "$DEV"))"
  k -n $ns exec rawapp -- sh -c 'echo raw-data-s2 | dd of=/dev/xvda bs=512 count=1 conv=sync,fsync 2>/dev/null' || fail "writing the block device"
  [ "$(k -n $ns exec rawapp -- sh -c 'dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -1')" = raw-data-s2 ] ||
    fail "block data read back differs"
  [ "$(read_backing "$BACKING" 11)" = raw-data-s2 ] || fail "the pod's block write is not in $(describe_backing "$BACKING")"
  k -n $ns delete pod rawapp --wait=true >/dev/null
  wait_until 60 "raw block volume unpublished and unstaged" released "$PV" "$BACKING"
  k -n $ns delete pvc raw --wait=true >/dev/null
  wait_until 60 "PV $PV deleted" gone pv "$PV"
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left after the volume was deleted"
  if [ "$CLASS_KIND" = loop ]; then s2_immediate $ns; fi
  delete_namespace $ns
}

# A pod on the claim (Filesystem mode, FSTYPE): the volume is the class's device with
# that filesystem, data written is read back; pod deleted -> unpublished and unstaged;
# claim deleted -> volume and its storage gone.
s2_filesystem() { # NAMESPACE PVC
  local ns=$1 pvc=$2
  apply_pod $ns app fs $pvc >/dev/null
  wait_until 90 "pod with the $FSTYPE claim Running" pod_phase_is $ns app Running
  volume_facts $ns $pvc
  note "PV $PV handle $HANDLE backing $BACKING on $DEV"
  expect_class_device
  expect_mounted "$PV" "$DEV" 2
  k -n $ns exec app -- sh -c 'echo cluster-data-s2 > /data/f && sync' || fail "writing into the volume"
  [ "$(k -n $ns exec app -- cat /data/f)" = cluster-data-s2 ] || fail "data read back differs"
  expect_pod_mount $ns app /data
  k -n $ns delete pod app --wait=true >/dev/null
  wait_until 60 "$FSTYPE volume unpublished and unstaged" released "$PV" "$BACKING"
  backing_present "$BACKING" || fail "$(describe_backing "$BACKING") gone while the claim exists"
  k -n $ns delete pvc $pvc --wait=true >/dev/null
  wait_until 60 "PV $PV deleted" gone pv "$PV"
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left after the volume was deleted"
  note "$FSTYPE claim: $(describe_backing "$BACKING") removed"
}

# A claim of an Immediate class whose allowedTopologies name this node: with no pod, the
# node's external-provisioner makes itself the claim's selected node (after its random
# delay, --node-deployment-base-delay, 20 s) and provisions it there; a pod then follows
# the volume to the node.
s2_immediate() { # NAMESPACE
  local ns=$1 sc=localvol-immediate-s2
  k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $sc}
provisioner: $DRIVER
volumeBindingMode: Immediate
parameters: {localvol.csi.dev/device-class: $DEVICE_CLASS, csi.storage.k8s.io/fstype: $FSTYPE}
allowedTopologies:
  - matchLabelExpressions: [{key: topology.localvol.csi.dev/node, values: [$NODE]}]
YAML
  apply_pvc $ns now "$FS_SIZE" $sc >/dev/null
  wait_until 120 "Immediate claim bound with no pod" claim_phase_is $ns now Bound
  [ "$(k -n $ns get pvc now -o jsonpath='{.metadata.annotations.volume\.kubernetes\.io/selected-node}')" = "$NODE" ] ||
    fail "the Immediate claim's selected node is not $NODE"
  volume_facts $ns now
  apply_pod $ns nowapp fs now >/dev/null
  wait_until 90 "pod with the Immediate claim Running" pod_phase_is $ns nowapp Running
  k -n $ns exec nowapp -- sh -c 'echo immediate-s2 > /data/f && sync' || fail "writing into the Immediate volume"
  [ "$(k -n $ns exec nowapp -- cat /data/f)" = immediate-s2 ] || fail "Immediate volume: data read back differs"
  k -n $ns delete pod nowapp --wait=true >/dev/null
  wait_until 60 "Immediate volume unpublished and unstaged" released "$PV" "$BACKING"
  k -n $ns delete pvc now --wait=true >/dev/null
  wait_until 60 "PV $PV deleted" gone pv "$PV"
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left after the Immediate volume was deleted"
  k delete storageclass $sc >/dev/null
}
