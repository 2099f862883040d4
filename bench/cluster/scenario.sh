# shellcheck shell=bash  # sourced, never run
# bench/cluster/scenario.sh - the cluster benchmark as a scenario of tests/cluster/run.sh
# (sourced through LOCALVOL_CLUSTER_EXTRA by bench/cluster/run.sh): deploys the peer
# (peer/), runs the benchmark client (benches/cluster) against both drivers, then
# removes the benchmark's volumes while both drivers still run, and the peer.
# shellcheck disable=SC2034  # read by tests/cluster/run.sh, which sources this file
EXTRA_SCENARIOS=(bench_cluster)
PEER_NS=localvol-bench-peer
PEER_DRIVER=hostpath.csi.k8s.io

peer_ready() { [ "$(k -n $PEER_NS get ds hostpath-peer -o jsonpath='{.status.numberReady}')" = 1 ]; }
peer_registered() { k get csinode "$NODE" -o jsonpath='{.spec.drivers[*].name}' | grep -qw $PEER_DRIVER; }

bench_cluster() {
  local exe=${LOCALVOL_BENCH_CLUSTER_EXE:?the benchmark client} work rc=0
  work=$(mktemp -d /tmp/localvol-bench-image.XXXXXX)
  # hostpathplugin calls mount(8): the same Debian root filesystem as localvol's image.
  python3 "$RECIPE/mkimage.py" --name localhost/hostpathplugin:bench --out "$work/hostpath.tar" \
    --base-tar "${rootfs:?tests/cluster/run.sh sets it}" --add "$KUBE_KIT_BIN/hostpathplugin:/hostpathplugin" --entrypoint '["/hostpathplugin"]' >/dev/null
  ctr --address "$KUBE_KIT_CRI_SOCK" -n k8s.io images import "$work/hostpath.tar" >/dev/null
  rm -rf "$work"
  k apply -k "$REPO/bench/cluster/peer" >/dev/null
  wait_until 120 "peer DaemonSet Ready" peer_ready
  wait_until 60 "peer registered with kubelet" peer_registered
  if [ -n "${LOCALVOL_BENCH_LOG_DIR:-}" ]; then
    # Each syscall, command and record write with its time, so that a slow call in
    # the kept logs says what it waited on (a line per step; no change at info).
    k -n "$SYSTEM_NS" set env ds/localvol-node -c localvol RUST_LOG=info,localvol::host=debug,localvol::backend=debug >/dev/null
    wait_until 120 "localvol restarted with debug logs" daemon_ready
    wait_until 60 "localvol registered again" registered
  fi
  new_namespace lvtest-bench
  LOCALVOL_BENCH_AUDIT_LOG=$AUDIT_LOG NODE_NAME=$NODE "$exe" ${LOCALVOL_BENCH_ARGS:-} || rc=$?
  if [ -n "${LOCALVOL_BENCH_LOG_DIR:-}" ]; then
    k -n "$SYSTEM_NS" logs ds/localvol-node -c localvol --tail=-1 >"$LOCALVOL_BENCH_LOG_DIR/localvol-last.log" 2>&1
    cp "$KUBE_KIT_STATE"/logs/kubelet.log "$LOCALVOL_BENCH_LOG_DIR/" 2>/dev/null
  fi
  delete_namespace lvtest-bench
  k delete -k "$REPO/bench/cluster/peer" --wait=true --timeout=120s >/dev/null
  [ $rc = 0 ] || fail "the benchmark client failed ($rc)"
}
