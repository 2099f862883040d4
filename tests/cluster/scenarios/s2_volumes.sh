# shellcheck shell=bash  # sourced, never run
# Scenario 2: WaitForFirstConsumer claims and their pods, side by side: one of the class's
# filesystem, one of the other of ext4 and xfs (a StorageClass's fstype parameter) and a
# raw block claim. Each is provisioned on this node, data written and read back; pods
# deleted -> unpublished and unstaged (no mount, no loop device), claims deleted ->
# volumes and backing files gone. The three run at once, as a node's pods do: the same
# checks as one after another, and a third of the waiting on an emulated node.
# For the class of lib.sh's CLASS_KIND (loop: backing files; lvm, lvm-thin: LVs, whose
# device-mapper device the pod's mount must be). On loop (the host suite) also a claim of
# an Immediate class, which does not depend on the backend (s2_immediate).
s2_volumes() {
  local ns=lvtest-s2 other=xfs size=320Mi   # mkfs.xfs refuses below 300 MB (tests/vm/README.md)
  [ "$FSTYPE" = xfs ] && other=ext4 size=$FS_SIZE
  new_namespace $ns
  apply_storage_class "lvtest-s2-$other" $other false
  apply_pvc $ns fs "$FS_SIZE" >/dev/null
  apply_pvc $ns "fs-$other" $size "lvtest-s2-$other" >/dev/null
  apply_pvc $ns raw "$BLOCK_SIZE" "$SC" Block >/dev/null
  sleep 1
  local claim
  for claim in fs "fs-$other" raw; do
    claim_phase_is $ns $claim Pending || fail "WaitForFirstConsumer claim $claim bound before a pod used it"
  done
  apply_pod $ns app fs fs >/dev/null
  apply_pod $ns "app-$other" fs "fs-$other" >/dev/null
  apply_pod $ns rawapp block raw /dev/xvda >/dev/null
  wait_until 90 "the $FSTYPE, $other and raw block pods Running" pods_running $ns app "app-$other" rawapp

  # Each claim's "PV BACKING" (names without spaces), kept for after its PV is gone.
  local volumes=() v
  s2_check_filesystem $ns app fs; volumes+=("$PV $BACKING")
  FSTYPE=$other s2_check_filesystem $ns "app-$other" "fs-$other"; volumes+=("$PV $BACKING")
  s2_check_block $ns rawapp raw; volumes+=("$PV $BACKING")

  k -n $ns delete pod app "app-$other" rawapp --wait=true >/dev/null
  for v in "${volumes[@]}"; do s2_released $v; done
  k -n $ns delete pvc fs "fs-$other" raw --wait=true >/dev/null
  for v in "${volumes[@]}"; do s2_deleted $v; done
  k delete storageclass "lvtest-s2-$other" >/dev/null
  if [ "$CLASS_KIND" = loop ]; then s2_immediate $ns; fi
  delete_namespace $ns
}

# One claim's whole lifecycle, alone (scenario 12's loop claim): a pod on the claim
# (Filesystem mode, FSTYPE), checked, deleted, then the claim.
s2_filesystem() { # NAMESPACE PVC
  local ns=$1 pvc=$2
  apply_pod $ns app fs $pvc >/dev/null
  wait_until 90 "pod with the $FSTYPE claim Running" pod_phase_is $ns app Running
  s2_check_filesystem $ns app $pvc
  k -n $ns delete pod app --wait=true >/dev/null
  s2_released "$PV" "$BACKING"
  k -n $ns delete pvc $pvc --wait=true >/dev/null
  s2_deleted "$PV" "$BACKING"
}

# The volume of a Running pod's claim (Filesystem mode, FSTYPE) is the class's device with
# that filesystem, mounted for the pod; data written is read back. Sets lib.sh's PV,
# HANDLE, BACKING and DEV (volume_facts).
s2_check_filesystem() { # NAMESPACE POD PVC
  local ns=$1 pod=$2 pvc=$3
  s2_volume_of $ns $pvc "$FSTYPE" 2
  k -n $ns exec $pod -- sh -c 'echo cluster-data-s2 > /data/f && sync' || fail "writing into the $FSTYPE volume"
  [ "$(k -n $ns exec $pod -- cat /data/f)" = cluster-data-s2 ] || fail "$FSTYPE volume: data read back differs"
  expect_pod_mount $ns $pod /data
}

# The same for a raw block claim at /dev/xvda: the pod's device is the volume's, and
# its write is read back on the host, from the volume's storage.
s2_check_block() { # NAMESPACE POD PVC
  local ns=$1 pod=$2 pvc=$3
  s2_volume_of $ns $pvc "raw block" 1
  [ "$(pod_dev_majmin $ns $pod /dev/xvda)" = "$(majmin "$DEV")" ] ||
    fail "/dev/xvda in the pod is not $DEV ($(majmin "$DEV"))"
  k -n $ns exec $pod -- sh -c 'echo raw-data-s2 | dd of=/dev/xvda bs=512 count=1 conv=sync,fsync 2>/dev/null' || fail "writing the block device"
  [ "$(k -n $ns exec $pod -- sh -c 'dd if=/dev/xvda bs=512 count=1 2>/dev/null | head -1')" = raw-data-s2 ] ||
    fail "block data read back differs"
  [ "$(read_backing "$BACKING" 11)" = raw-data-s2 ] || fail "the pod's block write is not in $(describe_backing "$BACKING")"
}

# The claim's volume (lib.sh's PV, HANDLE, BACKING and DEV) is the class's device, with
# at least MOUNTS mounts of it on the host.
s2_volume_of() { # NAMESPACE PVC WHAT MOUNTS
  volume_facts "$1" "$2"
  note "PV $PV handle $HANDLE backing $BACKING on $DEV ($3)"
  expect_class_device
  expect_mounted "$PV" "$DEV" "$4"
}

# After its pod is gone: the volume unpublished and unstaged, its storage kept.
s2_released() { # PV BACKING
  wait_until 60 "volume $1 unpublished and unstaged" released "$1" "$2"
  backing_present "$2" || fail "$(describe_backing "$2") gone while the claim exists"
}
# After its claim is gone: the PV and the volume's storage gone.
s2_deleted() { # PV BACKING
  wait_until 60 "PV $1 deleted" gone pv "$1"
  backing_gone "$2" || fail "$(describe_backing "$2") left after the volume was deleted"
  note "$(describe_backing "$2") removed"
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
