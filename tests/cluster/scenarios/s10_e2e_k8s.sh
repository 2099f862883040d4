# shellcheck shell=bash  # sourced, never run
# Scenario 10: tests/e2e_k8s.rs against this cluster's API server, with
# kube-controller-manager's garbage collector and ephemeral volume controller acting on
# its objects: a localvol of the test's own (in its process, loop backend in a temp dir,
# builtin registration off, pods bound to node localvol-e2e-node so that no kubelet
# starts them) is driven over its socket as kubelet drives it, and its owner checks of
# generic ephemeral volumes are asserted on real Pods, PVCs and PVs. A plain `cargo test`
# reports that test as ignored; this is where it runs.
s10_e2e_k8s() {
  ignored_test "$(test_binary e2e_k8s)" e2e_k8s   # lib.sh
  note "NOTE s10: tests/e2e_k8s.rs passed against the cluster's API server"
}
