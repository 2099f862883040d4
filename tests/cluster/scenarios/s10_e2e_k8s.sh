# shellcheck shell=bash  # sourced, never run
# Scenario 10: tests/e2e_k8s.rs against this cluster's API server, with
# kube-controller-manager's garbage collector and ephemeral volume controller acting on
# its objects: a localvol of the test's own (in its process, loop backend in a temp dir,
# builtin registration off, pods bound to node localvol-e2e-node so that no kubelet
# starts them) is driven over its socket as kubelet drives it, and its owner checks of
# generic ephemeral volumes are asserted on real Pods, PVCs and PVs. A plain `cargo test`
# reports that test as ignored; this is where it runs.
s10_e2e_k8s() {
  local bin
  bin=$(cd "$REPO" && cargo test --locked --no-run --test e2e_k8s --message-format=json 2>/dev/null |
    grep '"name":"e2e_k8s"' | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
  [ -x "$bin" ] || fail "cannot build tests/e2e_k8s.rs"
  local out rc=0
  out=$("$bin" --ignored --nocapture 2>&1) || rc=$?
  printf '%s\n' "$out" | tail -n 30
  [ "$rc" = 0 ] || fail "tests/e2e_k8s.rs failed (exit $rc)"
  grep -q '^test result: ok. 1 passed' <<<"$out" || fail "tests/e2e_k8s.rs did not pass its one test"
  note "NOTE s10: tests/e2e_k8s.rs passed against the cluster's API server"
}
