# shellcheck shell=bash  # sourced, never run
# Scenario 7: /metrics of the daemon pod (host network here, port 9808 as the manifests
# set) shows the calls kubelet made for a pod's volume (stage, publish, unpublish,
# unstage) and the provisioner's (create, delete). localvol counts only the volume
# calls: NodeGetCapabilities, NodeGetInfo and the Identity calls are not in
# localvol_rpc_requests_total (reported, not asserted).
s7_metrics() {
  local ns=lvtest-s7 port
  port=$(k -n "$SYSTEM_NS" get ds localvol-node -o jsonpath='{.spec.template.spec.containers[0].env[?(@.name=="LOCALVOL_METRICS_ADDR")].value}')
  port=${port##*:}
  [ -n "$port" ] || fail "no LOCALVOL_METRICS_ADDR in the DaemonSet"
  new_namespace $ns
  apply_pvc $ns m 32Mi >/dev/null
  apply_pod $ns app fs m >/dev/null
  wait_until 90 "pod Running" pod_phase_is $ns app Running
  local m; m=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "scraping 127.0.0.1:$port/metrics"
  local call
  for call in NodeStageVolume NodePublishVolume CreateVolume; do
    s7_count "$m" $call Ok >/dev/null || fail "no successful $call in /metrics"
    note "metrics: $call Ok = $(s7_count "$m" $call Ok)"
  done
  k -n $ns delete pod app --wait=true >/dev/null
  local pv; pv=$(pv_of $ns m)
  k -n $ns delete pvc m --wait=false >/dev/null
  wait_until 60 "volume deleted" gone pv "$pv"
  m=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "scraping again"
  for call in NodeUnpublishVolume NodeUnstageVolume DeleteVolume; do
    s7_count "$m" $call Ok >/dev/null || fail "no successful $call in /metrics"
    note "metrics: $call Ok = $(s7_count "$m" $call Ok)"
  done
  note "NOTE s7: $(grep -c '^localvol_rpc_requests_total' <<<"$m") rpc counters scraped from 127.0.0.1:$port"
  delete_namespace $ns
}
s7_count() { # METRICS METHOD CODE
  awk -v m="$2" -v c="$3" '$1 ~ /^localvol_rpc_requests_total\{/ && index($1, "method=\"" m "\"") && index($1, "code=\"" c "\"") && $2 > 0 {print $2; found=1} END {exit !found}' <<<"$1"
}
