# shellcheck shell=bash  # sourced, never run
# Scenario 13: encryption at rest under a real kubelet (docs/encryption.md). A
# StorageClass with localvol.csi.dev/encryption: luks2 whose node-stage Secret is
# templated per claim (${pvc.name}-luks): the claim's pod runs on the dm-crypt mapping
# (its mount is the mapping's, the LV holds a LUKS header and no plaintext), and its
# data is intact in a second pod after the first is deleted (unstage closed the
# mapping, the new stage opened it with the Secret again), and it grows online. A
# claim whose Secret has no
# `passphrase` key never mounts, and localvol's Warning is on that claim. Needs
# device-mapper: the guest's lvm-thin class (tests/vm/cluster.sh).
s13_encryption() {
  local ns=lvtest-s13 sc=lvtest-luks marker=LVTEST-S13-PLAINTEXT-7d2c
  new_namespace $ns
  k apply -f - >/dev/null <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $sc, labels: {lvtest: "1"}}
provisioner: $DRIVER
parameters:
  localvol.csi.dev/device-class: $DEVICE_CLASS
  localvol.csi.dev/encryption: luks2
  csi.storage.k8s.io/fstype: ext4
  csi.storage.k8s.io/node-stage-secret-name: \${pvc.name}-luks
  csi.storage.k8s.io/node-stage-secret-namespace: \${pvc.namespace}
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
YAML
  k -n $ns create secret generic sealed-luks --from-literal=passphrase="s13-$RANDOM-$RANDOM" >/dev/null
  # A Secret with the key misnamed: kubelet passes it, localvol finds no passphrase.
  k -n $ns create secret generic unkeyed-luks --from-literal=password=x >/dev/null
  apply_pvc $ns sealed 64Mi $sc >/dev/null
  apply_pvc $ns unkeyed 64Mi $sc >/dev/null
  apply_pod $ns writer fs sealed /data "echo $marker > /data/f; sync; while true; do sleep 3600 & wait \$!; done" >/dev/null
  apply_pod $ns nokey fs unkeyed >/dev/null
  wait_until 120 "pod on the encrypted claim Running" pod_phase_is $ns writer Running
  volume_facts $ns sealed
  [ "$(blkid -o value -s TYPE "$DEV")" = crypto_LUKS ] || fail "$DEV holds no LUKS header"
  local mapping=/dev/mapper/localvol-crypt-$HANDLE
  [ -b "$mapping" ] || fail "no mapping $mapping while the pod runs"
  mounts_of "$PV" "$mapping" | grep -q . || fail "the pod's volume is not mounted from $mapping"
  [ "$(k -n $ns exec writer -- cat /data/f)" = $marker ] || fail "data in the pod"
  sync; echo 3 >/proc/sys/vm/drop_caches
  grep -q -a -F $marker "$mapping" || fail "the plaintext is not on the mapping (the check would prove nothing)"
  ! grep -q -a -F $marker "$DEV" || fail "the plaintext reached the LV $DEV"
  note "NOTE s13: $HANDLE on $DEV (crypto_LUKS), mounted from $mapping; no plaintext on the LV"

  k -n $ns delete pod writer --wait=true >/dev/null
  wait_until 60 "mapping $mapping closed at unstage" test ! -e "$mapping"
  apply_pod $ns reader fs sealed >/dev/null
  wait_until 120 "a second pod on the encrypted claim Running" pod_phase_is $ns reader Running
  [ "$(k -n $ns exec reader -- cat /data/f)" = $marker ] || fail "data after the pod was replaced"
  # Online growth through the resizer the overlay runs: the LV, the mapping, then ext4.
  local before; before=$(s13_fs_kib $ns reader)
  k -n $ns patch pvc sealed -p '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}' >/dev/null
  wait_until 180 "the encrypted filesystem grown in the pod" s13_grown $ns reader $((before + 48 * 1024))
  note "NOTE s13: ext4 on the mapping grew online from $before to $(s13_fs_kib $ns reader) KiB"

  wait_until 90 "localvol's Warning on the claim whose Secret has no passphrase" encryption_warned $ns unkeyed
  pod_phase_is $ns nokey Pending || fail "the pod without a passphrase left Pending"
  note "NOTE s13: $(k -n $ns get events --field-selector involvedObject.name=unkeyed,reason=EncryptedVolumeNotOpened \
    -o jsonpath='{.items[0].note}{.items[0].message}' | cut -c1-200)"

  k -n $ns delete pod reader nokey --wait=true >/dev/null
  wait_until 60 "mapping $mapping closed" test ! -e "$mapping"
  delete_namespace $ns
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left"
  k delete storageclass $sc >/dev/null
}

encryption_warned() { # NAMESPACE CLAIM
  k -n "$1" get events --field-selector "involvedObject.name=$2,reason=EncryptedVolumeNotOpened,type=Warning" \
    -o jsonpath='{.items[*].message}{.items[*].note}' | grep -q passphrase
}
s13_fs_kib() { k -n "$1" exec "$2" -- df -Pk /data | awk 'NR == 2 {print $2}'; }
s13_grown() { [ "$(s13_fs_kib "$1" "$2")" -ge "$3" ]; }
