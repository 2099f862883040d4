# shellcheck shell=bash  # sourced, never run
# Scenario 12 (the QEMU guest's "mixed" run, tests/cluster/overlays/mixed): one
# configuration with a loop, a pmem and an lvm class on a node that lacks the lvm class's
# volume group. As README "One configuration can serve nodes with different storage"
# says: the DaemonSet is Ready, the loop and pmem classes are served (a pod on loop),
# and the lvm class is reported missing (a DeviceClassStorageMissing Warning on the
# Node, /readyz's body, localvol_device_class_available 0) and gets no volume; once the
# volume group is made, the next stats refresh serves it and its waiting pod starts.
# It reuses scenario 2's claim-and-pod lifecycle.
declare -F s2_filesystem >/dev/null || source "$(dirname "${BASH_SOURCE[0]}")/s2_volumes.sh"
s12_mixed_node() {
  local ns=lvtest-s12 port m
  port=$(k -n "$SYSTEM_NS" get ds localvol-node -o jsonpath='{.spec.template.spec.containers[0].env[?(@.name=="LOCALVOL_METRICS_ADDR")].value}')
  port=${port##*:}
  [ -n "$port" ] || fail "no LOCALVOL_METRICS_ADDR in the DaemonSet"
  ! vgs localvol >/dev/null 2>&1 || fail "the lvm class's volume group localvol exists before the scenario"

  # Reported missing, the others served.
  wait_until 60 "a DeviceClassStorageMissing event on Node $NODE naming the lvm class" s12_missing_event
  note "NOTE s12: Node event: $(s12_missing_event | head -1)"
  curl -sf "http://127.0.0.1:$port/readyz" >/dev/null || fail "/readyz is not 200 with one class missing"
  curl -sf "http://127.0.0.1:$port/readyz" | grep -q '^device class lvm not served: ' ||
    fail "/readyz does not name the missing class: $(curl -s "http://127.0.0.1:$port/readyz")"
  m=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "scraping /metrics"
  local class want
  for class in loop:1 pmem:1 lvm:0; do
    want=${class#*:} class=${class%:*}
    grep -qx "localvol_device_class_available{device_class=\"$class\"} $want" <<<"$m" ||
      fail "localvol_device_class_available of $class is not $want: $(grep device_class_available <<<"$m")"
  done

  new_namespace $ns
  # The lvm claim first: it waits, and must not get a volume while the class is missing.
  apply_pvc $ns lvm "$FS_SIZE" localvol-mixed-lvm >/dev/null
  apply_pod $ns lvmapp fs lvm >/dev/null
  # The loop class serves a pod (the only loop volume under the guest's kubelet); the
  # pmem class's own run (pmem direct) covers its claims: here it is served (above).
  apply_pvc $ns loop "$FS_SIZE" localvol-mixed-loop >/dev/null
  CLASS_KIND=loop FSTYPE=ext4 s2_filesystem $ns loop
  [ "$(k -n $ns get pod lvmapp -o jsonpath='{.status.phase}')" = Pending ] || fail "the pod of the missing class is not Pending"
  [ -z "$(pv_of $ns lvm)" ] || fail "the claim of the missing class got volume $(pv_of $ns lvm)"
  note "NOTE s12: the lvm class's pod while its volume group is missing: $(k -n $ns get events --field-selector involvedObject.name=lvmapp -o jsonpath='{.items[-1:].message}')"

  # The volume group appears: served from the next stats refresh (30 s), and the
  # provisioner's next capacity poll (1 min) lets the scheduler place the pod.
  pvcreate -q -y "$VG_DISK" && vgcreate -q localvol "$VG_DISK" || fail "making the volume group localvol"
  local made=$SECONDS
  wait_until 240 "the lvm class's pod Running once its volume group exists" pod_phase_is $ns lvmapp Running
  note "NOTE s12: the lvm class's pod Running $((SECONDS - made))s after its volume group was made"
  CLASS_KIND=lvm LVM_VG=localvol volume_facts $ns lvm
  CLASS_KIND=lvm expect_class_device
  k -n $ns exec lvmapp -- sh -c 'echo mixed-s12 > /data/f && sync' || fail "writing into the lvm volume"
  [ "$(k -n $ns exec lvmapp -- cat /data/f)" = mixed-s12 ] || fail "lvm data read back differs"
  m=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "scraping /metrics"
  grep -qx 'localvol_device_class_available{device_class="lvm"} 1' <<<"$m" || fail "the lvm class is still reported missing"
  if curl -sf "http://127.0.0.1:$port/readyz" | grep -q 'not served'; then fail "/readyz still names a missing class"; fi
  delete_namespace $ns
  CLASS_KIND=lvm backing_gone "$BACKING" || fail "LV $BACKING left after its claim was deleted"
}
s12_missing_event() {
  k -n default get events --field-selector reason=DeviceClassStorageMissing,involvedObject.kind=Node \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep 'device class lvm '
}
