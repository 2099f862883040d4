# shellcheck shell=bash  # sourced, never run
# Scenario 1: the DaemonSet is Ready and kubelet has registered localvol (CSINode lists
# it with its topology key), by the registration this run deploys (builtin by default:
# the shipped overlay). The sidecar overlay is checked too (loop class only: see
# other_registration_overlay): it replaces the deployment, registers again, and the
# run's own overlay is restored.
s1_registration() {
  check_registration() { # WHAT
    wait_until 120 "DaemonSet Ready ($1)" daemon_ready
    wait_until 60 "CSINode $NODE lists $DRIVER with topology.localvol.csi.dev/node ($1)" registered
    local containers; containers=$(k -n "$SYSTEM_NS" get pod "$(daemon_pod)" -o jsonpath='{.spec.containers[*].name}')
    note "daemon pod containers: $containers"
    case $1 in
      builtin) [[ " $containers " != *" node-driver-registrar "* ]] || fail "builtin overlay runs the registrar sidecar"
               [ -S /var/lib/kubelet/plugins_registry/$DRIVER-reg.sock ] || fail "no registration socket of localvol on the host" ;;
      sidecar) [[ " $containers " == *" node-driver-registrar "* ]] || fail "sidecar overlay lacks node-driver-registrar" ;;
    esac
    ! grep -q 'RST_STREAM\|PROTOCOL_ERROR' <(tail -n 200 "$KUBE_KIT_STATE/logs/kubelet.log" | grep -i "$DRIVER") ||
      fail "kubelet.log has stream errors talking to $DRIVER"
  }
  check_registration "$REGISTRATION"
  local other="" other_overlay=""
  read -r other other_overlay <<<"$(other_registration_overlay)" || true
  if [ -z "$other" ]; then
    note "NOTE s1: $REGISTRATION registration only: no overlay with the other registration for class $DEVICE_CLASS"
    return 0
  fi
  k apply -k "$other_overlay" >/dev/null
  # Wait for the rollout to replace the pod, then for the registration again.
  wait_until 120 "rollout to the $other overlay" k -n "$SYSTEM_NS" rollout status ds/localvol-node --timeout=5s
  check_registration "$other"
  k apply -k "$OVERLAY" >/dev/null
  wait_until 120 "rollout back to the $REGISTRATION overlay" k -n "$SYSTEM_NS" rollout status ds/localvol-node --timeout=5s
  check_registration "$REGISTRATION"
}
