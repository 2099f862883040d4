# Scenario 5: ReclaimSpace. A claim annotated with a schedule is trimmed on it (the
# backing file's allocated bytes fall after a file is deleted in the pod), and
# `localvol reclaim` / `localvol status` work through `kubectl exec` in the daemon pod.
s5_reclaim() {
  local ns=lvtest-s5
  new_namespace $ns
  apply_pvc $ns trim 256Mi localvol-loop Filesystem '{"reclaimspace.csiaddons.openshift.io/schedule": "* * * * *"}' >/dev/null
  apply_pod $ns app fs trim >/dev/null
  wait_until 90 "pod Running" pod_phase_is $ns app Running
  volume_facts $ns trim
  s5_fill_and_delete $ns
  local full; full=$(allocated_bytes "$BACKING")
  note "backing file allocated after write + delete: $((full >> 20)) MiB"
  wait_until 90 "scheduled reclaim punched the freed blocks" s5_dropped_below "$BACKING" $((full - (48 << 20)))
  note "NOTE s5: scheduled (* * * * *): $((full >> 20)) -> $(( $(allocated_bytes "$BACKING") >> 20 )) MiB allocated"

  local dpod; dpod=$(daemon_pod)
  k -n "$SYSTEM_NS" exec "$dpod" -c localvol -- localvol status >"$LOGS/s5-status.txt" 2>&1 ||
    { cat "$LOGS/s5-status.txt"; fail "localvol status in the daemon pod failed"; }
  grep -q "${HANDLE}" "$LOGS/s5-status.txt" || { cat "$LOGS/s5-status.txt"; fail "localvol status does not list $HANDLE"; }
  s5_fill_and_delete $ns
  full=$(allocated_bytes "$BACKING")
  local out
  out=$(k -n "$SYSTEM_NS" exec "$dpod" -c localvol -- localvol reclaim "$HANDLE" 2>&1) || fail "localvol reclaim: $out"
  note "localvol reclaim: $out"
  local after; after=$(allocated_bytes "$BACKING")
  [ "$after" -lt $((full - (48 << 20))) ] || fail "on-demand reclaim: allocated $((full >> 20)) -> $((after >> 20)) MiB"
  note "NOTE s5: on demand (kubectl exec localvol reclaim): $((full >> 20)) -> $((after >> 20)) MiB allocated"
  k -n $ns delete pod app --wait=true >/dev/null
  delete_namespace $ns
  [ ! -e "$BACKING" ] || fail "backing file $BACKING left"
}
s5_fill_and_delete() {
  k -n "$1" exec app -- sh -c 'dd if=/dev/urandom of=/data/big bs=1M count=64 2>/dev/null && sync && rm /data/big && sync'
}
s5_dropped_below() { [ "$(allocated_bytes "$1")" -lt "$2" ]; }
