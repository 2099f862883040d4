#!/usr/bin/env bash
# tests/sanity/host.sh - csi-sanity on the host's loop class, filesystem and raw block
# (tests/sanity/run.sh, one result line each). Installs the kube-kit's binaries first
# (tests/sanity/kit.sh: NOT RUN without the kit, a failure when CI=true). Needs root
# (loop devices, mounts).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
cd "$HERE/../.."
# shellcheck source=tests/sanity/kit.sh
. tests/sanity/kit.sh
sanity_kit "csi-sanity (host, loop)" || exit 0
# LOCALVOL_BIN: a built localvol (tests/all.sh: its test build's), else built here.
if [ -z "${LOCALVOL_BIN:-}" ]; then
  cargo build --locked --bin localvol 2>&1 | tail -n 1
  export LOCALVOL_BIN=${CARGO_TARGET_DIR:-target}/debug/localvol
fi

# The loop class allocates whole MiB (src/backend/loopdev.rs ALIGNMENT): 64 and 128 of them.
granule=$((1 << 20))
failed=0
for access in mount block; do
  tests/sanity/run.sh --label loop --access $access --size $((64 * granule)) --expand-size $((128 * granule)) \
    || failed=1
done
exit $failed
