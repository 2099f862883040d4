# shellcheck shell=bash  # sourced, never run
# Scenario 6: the daemon is SIGKILLed and its pod deleted while a workload has a
# volume mounted: the workload keeps its data, a new daemon pod becomes Ready (and is
# registered again), and the later unmount works.
s6_daemon_restart() {
  local ns=lvtest-s6
  new_namespace $ns
  apply_pvc $ns keep "$FS_SIZE" >/dev/null
  apply_pod $ns app fs keep >/dev/null
  wait_until 90 "workload Running" pod_phase_is $ns app Running
  volume_facts $ns keep
  k -n $ns exec app -- sh -c 'echo survives > /data/f && sync'
  local old pid
  old=$(daemon_pod)
  pid=$(container_pid "$SYSTEM_NS" "$old" localvol) || true
  [ -n "$pid" ] || fail "no host PID for the localvol container of $old"
  grep -q localvol "/proc/$pid/cmdline" || fail "PID $pid is not localvol"
  # SIGKILL first: once the pod is being deleted, kubelet's SIGTERM may end the daemon
  # (cleanly) before a SIGKILL reaches it.
  kill -KILL "$pid"
  k -n "$SYSTEM_NS" delete pod "$old" --wait=false >/dev/null
  note "localvol PID $pid SIGKILLed, daemon pod $old deleted"
  wait_until 120 "a new daemon pod Ready" s6_replaced "$old"
  wait_until 60 "CSINode lists $DRIVER again" registered
  [ "$(k -n $ns exec app -- cat /data/f)" = survives ] || fail "the workload lost its data"
  k -n $ns exec app -- sh -c 'echo still-writable >> /data/f && sync' || fail "the workload cannot write any more"
  expect_mounted "$PV" "$DEV" 2
  k -n $ns delete pod app --wait=true >/dev/null
  wait_until 60 "unpublished and unstaged by the new daemon" released "$PV" "$BACKING"
  delete_namespace $ns
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left"
}
s6_replaced() { local p; p=$(daemon_pod); [ -n "$p" ] && [ "$p" != "$1" ] && daemon_ready; }
