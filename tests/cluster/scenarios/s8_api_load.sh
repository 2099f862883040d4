# shellcheck shell=bash  # sourced, never run
# Scenario 8: the daemon's API footprint grows with its own node's claims only. The API
# server's audit log (run.sh starts it with one, Metadata level, the daemon pod's service
# account only) is read for the localvol container's requests (the provisioner sidecar
# shares the service account; its user agent tells them apart) in equal windows: with
# 1, 10 and 50 claims provisioned on this node (selected-node annotation, no pods), then
# with 500 more claims that concern another node (selected-node names a node that does
# not exist, so they stay Pending), which are changed once during their window. Fails
# if the daemon reads or watches claims without this node's label selector, makes any
# request about the other node's claims, opens claim watches per claim (more than its
# two, each re-opened once), or makes more claim requests with the other node's claims
# than with its own 50 plus one read of each of those (a resync may fall in a window).
# Prints a table.
S8_WINDOW=${S8_WINDOW:-8}
s8_api_load() {
  local ns=lvtest-s8 other=lvtest-s8-other audit=$AUDIT_LOG
  [ -s "$audit" ] || fail "no audit log at $audit (run.sh starts the API server with one)"
  new_namespace $ns
  local n=0 target rows=() start; start=$(date -u +%s.%N)
  for target in 1 10 50; do
    s8_claims $ns local $n $target "$NODE" | k apply -f - >/dev/null
    n=$target
    wait_until 90 "$target claims bound" s8_bound $ns $target
    rows+=("$(s8_window "$start" "$target" 0 "$other" "")")
  done
  new_namespace $other
  # create, not apply: one request per claim, not two.
  s8_claims $other foreign 0 500 node-elsewhere | k create -f - >/dev/null
  note "500 claims of node-elsewhere created"
  rows+=("$(s8_window "$start" 50 500 "$other" change)")

  note "NOTE s8: API requests of the localvol container, ${S8_WINDOW}s windows (audit log)"
  note "NOTE s8:   local  other  requests  claim-requests  watches-opened  claim-watches  other-claim-requests"
  local row; for row in "${rows[@]}"; do note "NOTE s8:   $row"; done
  # Columns: local other requests claim_requests watches claim_watches other_claim_requests
  local r50 rother; read -r -a r50 <<<"${rows[2]}"; read -r -a rother <<<"${rows[3]}"
  [ "${rother[6]}" = 0 ] || fail "the daemon made ${rother[6]} requests about another node's claims"
  # Two claim watches at most (node resizer, reclaim scheduler), re-opened at most
  # once each in the scenario: never one per claim.
  [ "${rother[5]}" -le 4 ] || fail "${rother[5]} claim watches opened while claims were added"
  # The node's own 50 claims may each be read once in a window (the resizer's resync);
  # the other node's 500 must cost nothing.
  [ "${rother[3]}" -le $((r50[3] + 50)) ] ||
    fail "claim requests grew from ${r50[3]} to ${rother[3]} with another node's 500 claims"
  s8_unlabelled "$start"
  # Pending claims without volumes: nothing to wait for (the node is purged at the end).
  k delete namespace $other --wait=false >/dev/null
  delete_namespace $ns
}

s8_claims() { # NAMESPACE PREFIX FROM TO NODE: PVC documents with selected-node=NODE
  local i
  for ((i = $3; i < $4; i++)); do
    cat <<YAML
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: $2-$i
  namespace: $1
  annotations: {volume.kubernetes.io/selected-node: $5}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: localvol-loop
  resources: {requests: {storage: 8Mi}}
YAML
  done
}

s8_bound() { # NAMESPACE COUNT
  [ "$(k -n "$1" get pvc -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' | grep -c '^Bound$')" = "$2" ]
}

# The daemon's audit events since START (epoch seconds) as compact JSON lines.
s8_events() { # START [END]
  jq -c --argjson s "$1" --argjson e "${2:-1e12}" '
    select(.user.username == "system:serviceaccount:'"$SYSTEM_NS"':localvol-node")
    | select((.userAgent // "") | startswith("csi-provisioner") | not)
    | (.stageTimestamp | sub("\\.[0-9]+Z$"; "Z") | fromdate) as $t
    | select($t >= ($s | floor) and $t < $e)' "$AUDIT_LOG"
}

# One row: LOCAL OTHER requests claim-requests watches-opened claim-watches other-claim-requests.
# requests and claim-requests are completed non-watch requests in a fresh window;
# watches-opened and claim-watches count since the scenario started.
s8_window() { # START LOCAL OTHER OTHER_NAMESPACE CHANGE
  local t0 t1; t0=$(date -u +%s)
  [ -z "$5" ] || k -n "$4" annotate pvc --all --overwrite localvol-test/touched="$t0" >/dev/null
  sleep "$S8_WINDOW"
  t1=$(date -u +%s)
  sleep 2 # the audit backend writes in batches
  local win all
  win=$(s8_events "$t0" "$t1")
  all=$(s8_events "$1")
  local req creq watches cwatches oreq
  req=$(jq -s '[.[] | select(.stage == "ResponseComplete" and .verb != "watch")] | length' <<<"$win")
  creq=$(jq -s '[.[] | select(.stage == "ResponseComplete" and .verb != "watch" and .objectRef.resource == "persistentvolumeclaims")] | length' <<<"$win")
  watches=$(jq -s '[.[] | select(.stage == "ResponseStarted" and .verb == "watch")] | length' <<<"$all")
  cwatches=$(jq -s '[.[] | select(.stage == "ResponseStarted" and .verb == "watch" and .objectRef.resource == "persistentvolumeclaims")] | length' <<<"$all")
  oreq=$(jq -s --arg ns "$4" '[.[] | select(.objectRef.namespace == $ns)] | length' <<<"$all")
  printf '%5s  %5s  %8s  %14s  %14s  %13s  %20s\n' "$2" "$3" "$req" "$creq" "$watches" "$cwatches" "$oreq"
}

# Every list and watch of claims by the daemon carried this node's label selector.
s8_unlabelled() { # START
  local bad
  bad=$(s8_events "$1" | jq -r 'select(.objectRef.resource == "persistentvolumeclaims" and (.verb == "list" or .verb == "watch"))
    | select(.requestURI | test("labelSelector=localvol.csi.dev%2Fnode%3D") | not) | .requestURI' | sort -u)
  [ -z "$bad" ] || fail "claims listed or watched without this node's label: $bad"
  note "NOTE s8: every claim list/watch of the daemon carried labelSelector=localvol.csi.dev/node=$NODE"
}
