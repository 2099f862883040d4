# shellcheck shell=bash  # sourced, never run
# Scenario 3: a generic ephemeral volume follows its pod; a second pod naming that
# pod's claim as a plain claim never starts (localvol's FAILED_PRECONDITION surfaces as
# kubelet's FailedMount, and localvol's Warning event is on the claim).
s3_ephemeral() {
  local ns=lvtest-s3
  new_namespace $ns
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: owner, namespace: $ns}
spec:
  terminationGracePeriodSeconds: 1
  hostNetwork: true   # as lib.sh's apply_pod makes them
  containers:
    - name: app
      image: localhost/busybox:1
      imagePullPolicy: Never
      command: ["sh", "-c", "echo mine > /scratch/f; trap 'exit 0' TERM; while true; do sleep 3600 & wait \$!; done"]
      volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes:
    - name: scratch
      ephemeral:
        volumeClaimTemplate:
          spec:
            accessModes: [ReadWriteOnce]
            storageClassName: $SC
            resources: {requests: {storage: $FS_SIZE}}
YAML
  wait_until 90 "pod with a generic ephemeral volume Running" pod_phase_is $ns owner Running
  local claim=owner-scratch
  [ "$(k -n $ns get pvc $claim -o jsonpath='{.metadata.ownerReferences[0].name}')" = owner ] || fail "claim $claim not owned by the pod"
  volume_facts $ns $claim
  expect_class_device
  expect_mounted "$PV" "$DEV" 2
  [ "$(k -n $ns exec owner -- cat /scratch/f)" = mine ] || fail "ephemeral volume data"

  apply_pod $ns intruder fs $claim >/dev/null
  wait_until 90 "FailedMount event on the intruder pod with FailedPrecondition" intruder_refused $ns
  wait_until 30 "localvol's Warning event on claim $claim" claim_warned $ns $claim
  pod_phase_is $ns intruder Pending || fail "the intruder pod left Pending"
  [ -z "$(k -n $ns get pod intruder -o jsonpath='{.status.containerStatuses[0].state.running}')" ] || fail "intruder runs"
  note "NOTE s3: $(k -n $ns get events --field-selector involvedObject.name=intruder,reason=FailedMount -o jsonpath='{.items[0].message}' | cut -c1-220)"
  k -n $ns delete pod intruder --wait=true >/dev/null

  k -n $ns delete pod owner --wait=true >/dev/null
  wait_until 60 "claim $claim deleted with its pod" gone -n $ns pvc $claim
  wait_until 60 "PV $PV deleted" gone pv "$PV"
  expect_released "$PV" "$BACKING"
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left"
  delete_namespace $ns
}

intruder_refused() {
  k -n "$1" get events --field-selector involvedObject.name=intruder,reason=FailedMount -o jsonpath='{.items[*].message}' |
    grep -q 'FailedPrecondition'
}
claim_warned() {
  # events.k8s.io (kube-runtime's recorder) shows up in the core events list too.
  k -n "$1" get events --field-selector "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=$2,type=Warning" \
    -o jsonpath='{.items[*].reportingComponent}{.items[*].source.component}' | grep -q localvol
}
