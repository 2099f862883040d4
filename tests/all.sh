#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine, as root: installs what it needs,
# checks formatting and lints, runs the unit and privileged tests on the host, then
# the device-mapper / NVDIMM suites in a QEMU guest. Any failure fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==== %s (%s)\n' "$1" "$(date +%T)"; }

[ "$(id -u)" = 0 ] || { echo "tests/all.sh: run as root (loop devices, mounts, apt)" >&2; exit 1; }

step "host packages"
need=()
for tool in mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs losetup:mount blkid:util-linux fstrim:util-linux jq:jq; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

step "format and lints"
cargo fmt --all -- --check
cargo clippy --locked --all-targets -- -D warnings

# Soak mode, on demand: LOCALVOL_SOAK=1 bash tests/all.sh runs 500 crash lifecycles,
# 40 per class in the VM crash test, and fuzzes each target for 10 minutes (each can
# also be set on its own: LOCALVOL_CRASH_ROUNDS, LOCALVOL_CRASH_VM_ROUNDS).
if [ "${LOCALVOL_SOAK:-0}" = 1 ]; then
  export LOCALVOL_CRASH_ROUNDS=${LOCALVOL_CRASH_ROUNDS:-500}
  LOCALVOL_FUZZ_SECONDS=${LOCALVOL_FUZZ_SECONDS:-600}
fi

# The image's root filesystem (apt in a bookworm chroot: network and disk, little CPU)
# is made beside the host's test build; tests/cluster finds it in the cache.
step "image: the Dockerfile's runtime stage in a bookworm chroot, in the background"
echo "image build with docker/BuildKit: NOT RUN (no container engine or image registry)"
image_log=$(mktemp)
LOCALVOL_IMAGE_EXPORT=$(tests/image/runtime-stage.sh --export-path) \
  nice -n 10 tests/image/runtime-stage.sh >"$image_log" 2>&1 &
image_pid=$!

step "unit, privileged, crash, load, fault and hostile-input tests (host)"
# tests/crash.rs prints its seed first: LOCALVOL_CRASH_SEED=<hex> reproduces a failure.
cargo test --locked -- --test-threads=2

step "csi-sanity on the host: loop class, filesystem and raw block (tests/sanity/host.sh)"
tests/sanity/host.sh

step "deploy manifests"
command -v kubectl >/dev/null || [ ! -x ../shared/kube-kit/install.sh ] ||
  { ../shared/kube-kit/install.sh /var/cache/kube-kit >/dev/null; export PATH=$PATH:/var/cache/kube-kit/bin; }
command -v kubectl >/dev/null || { echo "tests/all.sh: kubectl not found; it renders deploy/ (kustomize)" >&2; exit 1; }
for overlay in deploy/overlays/*/; do
  kubectl kustomize "$overlay" >/dev/null
  echo "rendered $overlay"
done
if [ -n "${KUBECONFIG:-}" ]; then
  for overlay in deploy/overlays/*/; do
    kubectl apply --dry-run=server -k "$overlay" >/dev/null
    echo "server-side dry run accepted $overlay"
  done
else
  echo "deploy server-side dry run: NOT RUN (no KUBECONFIG)"
fi

step "image: waiting for the runtime stage"
if ! wait "$image_pid"; then cat "$image_log"; echo "tests/all.sh: the image's runtime stage failed" >&2; exit 1; fi
tail -n 3 "$image_log"

# The cluster suite mostly waits (kubelet, the API server); the VM guests and the fuzzer
# are CPU-bound. Run side by side, the guests and the fuzzer take the cores the cluster
# leaves idle, at a lower priority so that the cluster's timing-bound steps come first.
# The fuzzer shares the guests' priority: its instrumented build has a long serial tail
# (one rustc for the crate), which at nice 19 ran only after the guests, cores idle.
cluster_suite() {
  if [ ! -x ../shared/kube-kit/install.sh ]; then
    echo "cluster suite: NOT RUN: provide the kube-kit (kubelet, control plane, sidecars) at $(cd .. && pwd)/shared/kube-kit"
    [ "${CI:-}" != true ] || { echo "tests/all.sh: CI=true requires the cluster suite" >&2; return 1; }
    return 0
  fi
  local start=$SECONDS
  tests/cluster/run.sh
  echo "cluster suite: $((SECONDS - start))s (budget 720s)"
  [ $((SECONDS - start)) -le 720 ] || { echo "tests/all.sh: the cluster suite took over 12 minutes" >&2; return 1; }
}
fuzz_suite() {
  command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
  fuzz/run.sh "${LOCALVOL_FUZZ_SECONDS:-30}"
}
step "in parallel: cluster (tests/cluster/run.sh), VM (tests/vm/suite.sh, nice 10), fuzz (nice 10, ${LOCALVOL_FUZZ_SECONDS:-30}s per target)"
# The VM suite: LVM (thick, thin) and PMEM (direct, lvm) backends, csi-sanity on them, the
# random SIGKILL crash test (tests/crash_vm.rs prints its seed), ReclaimSpace on lvm-thin,
# and the VM harness's own smoke test.
declare -A pids started
background() {  # background NAME NICE COMMAND...: output prefixed with [NAME]
  local name=$1 level=$2; shift 2
  started[$name]=$SECONDS
  ( renice -n "$level" -p "$BASHPID" >/dev/null; "$@" ) > >(sed -u "s/^/[$name] /") 2>&1 &
  pids[$name]=$!
}
background cluster 0 cluster_suite
background vm 10 tests/vm/suite.sh
background fuzz 10 fuzz_suite
failed=()
for name in cluster vm fuzz; do
  rc=0; wait "${pids[$name]}" || rc=$?
  echo "==== $name: exit $rc, finished $((SECONDS - started[$name]))s after its start ($(date +%T))"
  [ "$rc" = 0 ] || failed+=("$name")
done
[ ${#failed[@]} = 0 ] || { echo "tests/all.sh: failed: ${failed[*]}" >&2; exit 1; }

echo
echo "tests/all.sh: all suites passed"
