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
for tool in mkfs.ext4:e2fsprogs mkfs.xfs:xfsprogs losetup:mount blkid:util-linux fstrim:util-linux; do
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

step "unit, privileged, crash, load, fault and hostile-input tests (host)"
# tests/crash.rs prints its seed first: LOCALVOL_CRASH_SEED=<hex> reproduces a failure.
cargo test --locked -- --test-threads=2

step "csi-sanity on the host: loop class, filesystem and raw block (tests/sanity/host.sh)"
tests/sanity/host.sh

step "deploy manifests"
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

step "image: the Dockerfile's runtime stage in a bookworm chroot (no container engine here)"
echo "image build with docker/BuildKit: NOT RUN (no container engine or image registry)"
tests/image/runtime-stage.sh

step "cluster: localvol from deploy/ on a real single-node Kubernetes (tests/cluster/run.sh)"
if [ -x ../shared/kube-kit/install.sh ]; then
  cluster_start=$SECONDS
  tests/cluster/run.sh
  echo "cluster suite: $((SECONDS - cluster_start))s (budget 600s)"
  [ $((SECONDS - cluster_start)) -le 600 ] || { echo "tests/all.sh: the cluster suite took over 10 minutes" >&2; exit 1; }
else
  echo "cluster suite: NOT RUN: provide the kube-kit (kubelet, control plane, sidecars) at $(cd .. && pwd)/shared/kube-kit"
  [ "${CI:-}" != true ] || { echo "tests/all.sh: CI=true requires the cluster suite" >&2; exit 1; }
fi

step "fuzz: request conversion and parsers (${LOCALVOL_FUZZ_SECONDS:-30}s per target)"
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
fuzz/run.sh "${LOCALVOL_FUZZ_SECONDS:-30}"

step "VM: device-mapper and NVDIMM smoke test"
tests/vm/smoke.sh

step "VM: LVM (thick, thin) and PMEM (direct, lvm) backends"
tests/vm/backends.sh

step "VM: random SIGKILL crash test on LVM (thick, thin) and PMEM (tests/crash_vm.rs prints its seed and counts)"
# The test binary built on the host, run directly (cargo's freshness check costs a minute under TCG).
LOCALVOL_VM_SUITE=1 tests/vm/run.sh --pmem-size 1G --timeout 1200 -- "$(cargo test --locked --no-run --test crash_vm 2>&1 | sed -n 's/^ *Executable .*(\(.*\))$/\1/p')" --test-threads=1 --nocapture

step "VM: ReclaimSpace on lvm-thin"
tests/vm/run.sh --pmem-size 0 -- cargo test --offline --locked --test reclaim_privileged lvm_thin

echo
echo "tests/all.sh: all suites passed"
