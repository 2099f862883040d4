# shellcheck shell=bash  # sourced, never run
# Scenario 14: the Helm chart (deploy/helm/localvol). Rendered with each of its ci/
# values files, accepted by the API server (a server-side dry run). Then installed in
# place of the overlay, with tests/cluster/helm-values.yaml, which renders the objects
# the overlay does (tests/helm.rs): helm install, a claim and its pod; helm upgrade to a
# changed device-class file and log level: the DaemonSet rolls, and the pod's volume
# stays mounted, readable and writable; helm rollback: it rolls back; the claim deleted
# by the chart's daemon; helm uninstall: no DaemonSet, CSIDriver or registration left.
# Then the overlay again, as the suite had it. The loop class, on the host's node.
s14_helm() {
  local ns=lvtest-s14 helm values=$REPO/tests/cluster/helm-values.yaml chart=$REPO/deploy/helm/localvol
  helm=$("$REPO/tests/tools/helm.sh") || fail "no helm (tests/tools/helm.sh)"
  local h=("$helm" --namespace "$SYSTEM_NS") values_file
  # Every configuration the chart ships, accepted by this API server as rendered.
  for values_file in "$chart"/ci/*-values.yaml; do
    "${h[@]}" template localvol "$chart" --values "$values_file" | k apply --dry-run=server -f - >/dev/null ||
      fail "the API server refuses the chart rendered with ${values_file#"$REPO"/}"
  done
  note "server-side dry run: the chart with each of $(echo "$chart"/ci/*-values.yaml | wc -w) values files accepted"
  k delete -k "$OVERLAY" --wait=true >/dev/null
  wait_until 90 "the overlay's namespace deleted" gone namespace "$SYSTEM_NS"
  wait_until 60 "CSINode no longer lists $DRIVER" s14_unregistered
  # The namespace as deploy/helm/localvol/README.md makes it.
  k create namespace "$SYSTEM_NS" >/dev/null
  k label namespace "$SYSTEM_NS" pod-security.kubernetes.io/enforce=privileged \
    pod-security.kubernetes.io/audit=privileged pod-security.kubernetes.io/warn=privileged >/dev/null

  "${h[@]}" install localvol "$chart" --values "$values" --wait --timeout 120s >/dev/null || fail "helm install"
  wait_until 120 "the chart's DaemonSet Ready" daemon_ready
  wait_until 60 "CSINode lists $DRIVER (the chart's daemon)" registered
  note "helm install: revision $(s14_revision)"
  new_namespace $ns
  apply_pvc $ns data "$FS_SIZE" >/dev/null
  apply_pod $ns app fs data >/dev/null
  wait_until 90 "pod with a claim of the chart's class Running" pod_phase_is $ns app Running
  volume_facts $ns data
  k -n $ns exec app -- sh -c 'echo helm-s14 > /data/f && sync' || fail "writing into the volume"

  # A changed device-class file (the loop class's limit) and log level.
  local changed old
  changed=$(mktemp)
  printf '%s\n' 'logLevel: debug' 'deviceClasses:' \
    '  - {name: loop, kind: loop, default: true, fs-type: ext4, directory: /var/lib/localvol/loop, capacity-gb: 200}' >"$changed"
  old=$(daemon_pod)
  "${h[@]}" upgrade localvol "$chart" --values "$values" --values "$changed" --wait --timeout 120s >/dev/null ||
    { rm -f "$changed"; fail "helm upgrade"; }
  rm -f "$changed"
  wait_until 120 "the upgraded DaemonSet's new pod Ready" daemon_replaced "$old"
  wait_until 60 "CSINode lists $DRIVER after the upgrade" registered
  [ "$(s14_log_level)" = debug ] || fail "helm upgrade: the daemon's RUST_LOG is $(s14_log_level), not debug"
  k -n "$SYSTEM_NS" get configmap localvol-config -o jsonpath='{.data.config\.yaml}' | grep -q 'capacity-gb: 200' ||
    fail "helm upgrade: the device-class file did not change"
  s14_still_served $ns "after helm upgrade (revision $(s14_revision))"

  old=$(daemon_pod)
  "${h[@]}" rollback localvol 1 --wait --timeout 120s >/dev/null || fail "helm rollback"
  wait_until 120 "the rolled-back DaemonSet's new pod Ready" daemon_replaced "$old"
  wait_until 60 "CSINode lists $DRIVER after the rollback" registered
  [ "$(s14_log_level)" = info ] || fail "helm rollback: the daemon's RUST_LOG is $(s14_log_level), not info"
  s14_still_served $ns "after helm rollback (revision $(s14_revision))"

  k -n $ns delete pod app --wait=true >/dev/null
  wait_until 60 "volume $PV unpublished and unstaged by the chart's daemon" released "$PV" "$BACKING"
  delete_namespace $ns
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left after its claim was deleted"

  "${h[@]}" uninstall localvol --wait --timeout 120s >/dev/null || fail "helm uninstall"
  wait_until 60 "the chart's DaemonSet gone" gone -n "$SYSTEM_NS" daemonset localvol-node
  gone csidriver "$DRIVER" || fail "helm uninstall left the CSIDriver"
  wait_until 60 "CSINode no longer lists $DRIVER after helm uninstall" s14_unregistered
  [ -z "$("${h[@]}" list --short)" ] || fail "helm list still shows a release"
  note "helm uninstall: nothing of the chart left"

  # As the suite had it.
  k delete namespace "$SYSTEM_NS" --wait=true >/dev/null
  k apply -k "$OVERLAY" >/dev/null
  wait_until 120 "the overlay's DaemonSet Ready again" daemon_ready
  wait_until 60 "CSINode lists $DRIVER again" registered
}
s14_unregistered() { ! registered; }
s14_revision() { "$helm" --namespace "$SYSTEM_NS" history localvol --max 1 -o json | python3 -c 'import json, sys; print(json.load(sys.stdin)[-1]["revision"])'; }
s14_log_level() {
  k -n "$SYSTEM_NS" get pod "$(daemon_pod)" -o jsonpath='{.spec.containers[?(@.name=="localvol")].env[?(@.name=="RUST_LOG")].value}'
}
# The pod's volume kept its data, mounted as before, and takes more.
s14_still_served() { # NAMESPACE WHEN
  [ "$(k -n "$1" exec app -- head -n 1 /data/f)" = helm-s14 ] || fail "the volume's data is gone $2"
  k -n "$1" exec app -- sh -c 'echo more >> /data/f && sync' || fail "the volume takes no more writes $2"
  expect_mounted "$PV" "$DEV" 2
  note "volume $PV still mounted, read and written $2"
}
