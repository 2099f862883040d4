# shellcheck shell=bash  # sourced, never run
# Scenario 5: ReclaimSpace. A claim annotated with a schedule is trimmed on it: after a
# file is deleted in the pod, the space its blocks took on the host is given back (the
# loop class: the backing file's allocated bytes; lvm-thin: the thin LV's mapped share
# and the pool's data_percent). `localvol reclaim` and `localvol status` work through
# `kubectl exec` in the daemon pod.
s5_reclaim() {
  local ns=lvtest-s5
  new_namespace $ns
  apply_pvc $ns trim 256Mi "$SC" Filesystem '{"reclaimspace.csiaddons.openshift.io/schedule": "* * * * *"}' >/dev/null
  apply_pod $ns app fs trim >/dev/null
  wait_until 90 "pod Running" pod_phase_is $ns app Running
  volume_facts $ns trim
  # The space in use is measured with the file written, before it is deleted: a scheduled
  # run may come between the delete and any later measurement (each minute), and then
  # the space is back before the test could see it taken (seen in the guest).
  local full pool_full pool_after=""
  s5_fill $ns
  full=$(used_bytes "$BACKING")
  [ "$CLASS_KIND" != lvm-thin ] || pool_full=$(pool_data_percent)
  s5_delete $ns
  note "$(describe_backing "$BACKING") used $((full >> 20)) MiB on the host with the file written${pool_full:+ (pool $THIN_POOL data_percent $pool_full)}; file deleted"
  wait_until 90 "scheduled reclaim gave back the freed blocks" s5_dropped_below "$BACKING" $((full - (48 << 20)))
  if [ "$CLASS_KIND" = lvm-thin ]; then
    pool_after=$(pool_data_percent)
    awk -v a="$pool_after" -v b="$pool_full" 'BEGIN {exit !(a < b)}' ||
      fail "the pool's data_percent did not fall: $pool_full -> $pool_after"
  fi
  note "NOTE s5: scheduled (* * * * *): $((full >> 20)) -> $(( $(used_bytes "$BACKING") >> 20 )) MiB used${pool_after:+; pool $THIN_POOL data_percent $pool_full -> $pool_after}"

  local dpod; dpod=$(daemon_pod)
  k -n "$SYSTEM_NS" exec "$dpod" -c localvol -- localvol status >"$LOGS/s5-status.txt" 2>&1 ||
    { cat "$LOGS/s5-status.txt"; fail "localvol status in the daemon pod failed"; }
  grep -q "${HANDLE}" "$LOGS/s5-status.txt" || { cat "$LOGS/s5-status.txt"; fail "localvol status does not list $HANDLE"; }
  s5_fill $ns
  full=$(used_bytes "$BACKING")
  s5_delete $ns
  # A scheduled run may trim before this one: the space must be back either way, and this
  # run must succeed and say what it did.
  local out
  out=$(k -n "$SYSTEM_NS" exec "$dpod" -c localvol -- localvol reclaim "$HANDLE" 2>&1) || fail "localvol reclaim: $out"
  [[ $out == *reclaimed* ]] || fail "localvol reclaim did not say what it reclaimed: $out"
  note "localvol reclaim: $out"
  local after; after=$(used_bytes "$BACKING")
  [ "$after" -lt $((full - (48 << 20))) ] || fail "on-demand reclaim: $((full >> 20)) -> $((after >> 20)) MiB used"
  note "NOTE s5: on demand (kubectl exec localvol reclaim): $((full >> 20)) -> $((after >> 20)) MiB used"
  k -n $ns delete pod app --wait=true >/dev/null
  delete_namespace $ns
  wait_until 60 "$(describe_backing "$BACKING") removed" backing_gone "$BACKING"
}
s5_fill() { k -n "$1" exec app -- sh -c 'dd if=/dev/urandom of=/data/big bs=1M count=64 2>/dev/null && sync'; }
s5_delete() { k -n "$1" exec app -- sh -c 'rm /data/big && sync'; }
s5_dropped_below() { [ "$(used_bytes "$1")" -lt "$2" ]; }
