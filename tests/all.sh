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

step "unit and privileged tests (host)"
cargo test --locked -- --test-threads=2

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

step "VM: device-mapper and NVDIMM smoke test"
tests/vm/smoke.sh

echo
echo "tests/all.sh: all suites passed"
