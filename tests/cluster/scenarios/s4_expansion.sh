# shellcheck shell=bash  # sourced, never run
# Scenario 4: online expansion of a mounted xfs claim, first by localvol's
# --node-resizer (the shipped default), then by a central csi-resizer Deployment
# (deploy/components/csi-resizer); each time the pod sees the new size and the claim's
# status ends as on any real cluster; a request the class cannot hold ends infeasible.
# On lib.sh's DEVICE_CLASS, with S4_FSTYPE (xfs by default: see the note below; the lvm
# classes in tests/vm/cluster-guest.sh use their own fstype) and the central csi-resizer
# overlay S4_CENTRAL_OVERLAY (none: that half is skipped). On pmem direct, whose volumes
# cannot grow, the refusal instead (s4_refused).
S4_FSTYPE=${S4_FSTYPE:-xfs}
S4_CLASS=lvtest-$S4_FSTYPE
S4_CENTRAL_OVERLAY=${S4_CENTRAL_OVERLAY-$HERE/overlays/central-resizer}
s4_expansion() {
  if [ "$CLASS_KIND" = pmem ]; then s4_refused; return; fi
  if [ "$S4_FSTYPE" = xfs ] && grep -q '^CapEff:' /proc/self/status && ! capsh_has_sys_resource; then
    note "NOTE s4: ext4 is not grown online here: root lacks CAP_SYS_RESOURCE on this machine, which resize2fs needs on a mounted ext4; xfs is used"
  fi
  apply_storage_class $S4_CLASS $S4_FSTYPE true
  local ns=lvtest-s4
  new_namespace $ns
  # Back to the run's overlay even when a step fails, so later scenarios see it.
  trap s4_restore EXIT
  s4_grow $ns node-resizer
  s4_infeasible $ns node-resizer

  if [ -z "$S4_CENTRAL_OVERLAY" ]; then
    note "NOTE s4: no central csi-resizer overlay for class $DEVICE_CLASS: --node-resizer only"
    delete_namespace $ns
    k delete storageclass $S4_CLASS >/dev/null
    return 0
  fi
  k apply -k "$S4_CENTRAL_OVERLAY" >/dev/null
  wait_until 120 "DaemonSet without --node-resizer rolled out" k -n "$SYSTEM_NS" rollout status ds/localvol-node --timeout=5s
  wait_until 90 "csi-resizer Deployment available" k -n "$SYSTEM_NS" rollout status deploy/localvol-resizer --timeout=5s
  k -n "$SYSTEM_NS" get ds localvol-node -o jsonpath='{.spec.template.spec.containers[0].args}' | grep -q node-resizer &&
    fail "the central-resizer component left --node-resizer on"
  s4_grow $ns csi-resizer
  s4_infeasible $ns csi-resizer
  delete_namespace $ns
  k delete storageclass $S4_CLASS >/dev/null
}

# pmem direct: a namespace cannot grow in place (docs/backends.md), and the shipped
# StorageClass says so up front (allowVolumeExpansion: false, which the API server
# enforces). A class that allows expansion anyway gets localvol's own refusal: the claim
# ends ControllerResizeInfeasible with the reason in a Warning event, nothing retried,
# nothing changed, the pod's data intact.
s4_refused() {
  local ns=lvtest-s4 sc=lvtest-s4-pmem pvc=grow
  apply_storage_class $sc $FSTYPE true
  new_namespace $ns
  apply_pvc $ns $pvc "$FS_SIZE" $sc >/dev/null
  apply_pod $ns app fs $pvc >/dev/null
  wait_until 90 "pod with the pmem claim Running" pod_phase_is $ns app Running
  volume_facts $ns $pvc
  k -n $ns exec app -- sh -c 'echo before-refusal > /data/f && sync'
  local size before; size=$(k -n $ns get pvc $pvc -o jsonpath='{.status.capacity.storage}')
  before=$(backing_bytes "$BACKING")
  k -n $ns patch pvc $pvc --type merge -p '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}' >/dev/null
  wait_until 90 "claim marked ControllerResizeInfeasible" s4_status_is $ns $pvc ControllerResizeInfeasible
  local why
  why=$(k -n $ns get events --field-selector "involvedObject.name=$pvc,type=Warning" -o jsonpath='{.items[*].message}')
  grep -q 'cannot grow in place' <<<"$why" || fail "no Warning event gives the reason: $why"
  local events1 events2
  events1=$(s4_resize_events $ns $pvc)
  sleep 20
  events2=$(s4_resize_events $ns $pvc)
  [ "$events2" -le $((events1 + 1)) ] || fail "resize retried after the refusal: failure events $events1 -> $events2 in 20 s"
  [ "$(k -n $ns get pvc $pvc -o jsonpath='{.status.capacity.storage}')" = "$size" ] || fail "capacity moved on a refused growth"
  [ "$(backing_bytes "$BACKING")" = "$before" ] || fail "$(describe_backing "$BACKING") changed size on a refused growth"
  [ "$(k -n $ns exec app -- cat /data/f)" = before-refusal ] || fail "data lost after the refusal"
  note "NOTE s4: pmem direct: growth refused: $(grep -o '[^.]*cannot grow in place[^.]*' <<<"$why" | head -1)"
  delete_namespace $ns
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left"
  k delete storageclass $sc >/dev/null
}

s4_restore() {
  k apply -k "$OVERLAY" >/dev/null
  k -n "$SYSTEM_NS" delete --ignore-not-found deployment/localvol-resizer serviceaccount/localvol-resizer \
    role/localvol-resizer-leader rolebinding/localvol-resizer-leader >/dev/null
  k delete --ignore-not-found clusterrole/localvol-resizer clusterrolebinding/localvol-resizer >/dev/null
  wait_until 120 "DaemonSet back to the $REGISTRATION overlay" k -n "$SYSTEM_NS" rollout status ds/localvol-node --timeout=5s
}

capsh_has_sys_resource() { # bit 24 of the effective capabilities
  local eff; eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
  (( (16#$eff >> 24) & 1 ))
}

pod_fs_bytes() { # NAMESPACE POD: size of /data as the pod sees it
  # -P: one line per filesystem (busybox wraps a long device name, /dev/VG/LV, otherwise).
  k -n "$1" exec "$2" -- df -P -k /data | awk 'NR == 2 {print $2 * 1024}'
}

# The claim's resize state when nothing is in progress: capacity and allocatedResources
# at the request, no allocatedResourceStatuses, no conditions.
claim_settled_at() { # NAMESPACE PVC SIZE
  local s
  s=$(k -n "$1" get pvc "$2" -o jsonpath='{.status.capacity.storage}|{.status.allocatedResources.storage}|{.status.allocatedResourceStatuses}|{.status.conditions}')
  [ "$s" = "$3|$3||" ]
}

s4_grow() { # NAMESPACE RESIZER
  local ns=$1 pvc=grow-$2
  apply_pvc $ns $pvc 320Mi $S4_CLASS >/dev/null
  apply_pod $ns app-$2 fs $pvc >/dev/null
  wait_until 90 "pod with the $S4_FSTYPE claim Running ($2)" pod_phase_is $ns app-$2 Running
  volume_facts $ns $pvc
  k -n $ns exec app-$2 -- sh -c 'grep " /data " /proc/mounts' | grep -q " $S4_FSTYPE " || fail "/data is not $S4_FSTYPE"
  k -n $ns exec app-$2 -- sh -c 'echo before-resize > /data/f && sync'
  local before; before=$(pod_fs_bytes $ns app-$2)
  k -n $ns patch pvc $pvc --type merge -p '{"spec":{"resources":{"requests":{"storage":"640Mi"}}}}' >/dev/null
  wait_until 120 "claim settled at 640Mi ($2)" claim_settled_at $ns $pvc 640Mi
  wait_until 30 "$(describe_backing "$BACKING") grown to 640Mi ($2)" s4_backing_grown "$BACKING" $((640 << 20))
  [ "$(k get pv "$PV" -o jsonpath='{.spec.capacity.storage}')" = 640Mi ] || fail "PV capacity not 640Mi"
  wait_until 60 "the pod sees the grown filesystem ($2)" s4_pod_grew $ns app-$2 "$before"
  [ "$(k -n $ns exec app-$2 -- cat /data/f)" = before-resize ] || fail "data lost in the resize"
  note "NOTE s4: $2: $S4_FSTYPE seen by the pod $((before >> 20)) MiB -> $(( $(pod_fs_bytes $ns app-$2) >> 20 )) MiB"
}
s4_backing_grown() { [ "$(backing_bytes "$1")" -ge "$2" ]; }
s4_pod_grew() { # NAMESPACE POD BEFORE; says what the host sees when not
  local now m; now=$(pod_fs_bytes "$1" "$2")
  [ "$now" -gt $(( $3 + (200 << 20) )) ] && return 0
  echo "the pod sees $now bytes at /data (before: $3); $DEV holds $(blockdev --getsize64 "$DEV" 2>&1) bytes; its mounts here:"
  mounts_of "$PV" "$DEV"
  m=$(mounts_of "$PV" "$DEV" | awk '{print $5}' | head -1)
  if [ -n "$m" ]; then
    df -B1 "$m"
    if [ "$S4_FSTYPE" = xfs ]; then xfs_info "$m"; else dumpe2fs -h "$DEV" 2>/dev/null | grep -i '^block count\|^block size'; fi
  fi
  return 1
}

s4_infeasible() { # NAMESPACE RESIZER: a request bigger than the class's 100 GB
  local ns=$1 pvc=grow-$2
  k -n $ns patch pvc $pvc --type merge -p '{"spec":{"resources":{"requests":{"storage":"200Gi"}}}}' >/dev/null
  wait_until 90 "claim marked ControllerResizeInfeasible ($2)" s4_status_is $ns $pvc ControllerResizeInfeasible
  local events1 events2
  events1=$(s4_resize_events $ns $pvc)
  sleep 20
  events2=$(s4_resize_events $ns $pvc)
  s4_status_is $ns $pvc ControllerResizeInfeasible || fail "infeasible status did not stay ($2): $(k -n $ns get pvc $pvc -o jsonpath='{.status}')"
  [ "$events2" -le $((events1 + 1)) ] || fail "resize retried after an infeasible request ($2): failure events $events1 -> $events2 in 20 s"
  [ "$(k -n $ns get pvc $pvc -o jsonpath='{.status.capacity.storage}')" = 640Mi ] || fail "capacity moved on an infeasible request"
  note "NOTE s4: $2: infeasible request: $(k -n $ns get pvc $pvc -o jsonpath='{.status.conditions[*].type}'), failure events $events1 -> $events2 in 20 s"
  k -n $ns delete pod app-$2 --wait=true >/dev/null
  k -n $ns delete pvc $pvc --wait=true >/dev/null
  wait_until 60 "PV $PV deleted" gone pv "$PV"
  backing_gone "$BACKING" || fail "$(describe_backing "$BACKING") left"
}
s4_status_is() { [ "$(k -n "$1" get pvc "$2" -o jsonpath='{.status.allocatedResourceStatuses.storage}')" = "$3" ]; }
# Warning events about the claim, counting repeats (core and events.k8s.io counts).
s4_resize_events() {
  k -n "$1" get events --field-selector "involvedObject.name=$2,type=Warning" -o json |
    python3 -c 'import json,sys; print(sum(max(e.get("count") or 1, (e.get("series") or {}).get("count") or 1) for e in json.load(sys.stdin)["items"]))'
}
