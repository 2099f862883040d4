#!/usr/bin/env bash
# tests/vm/backends.sh - the LVM and PMEM backend suite (tests/vm_backends.rs) on
# real device-mapper and an emulated NVDIMM: builds the test binaries on the host,
# runs them in one tests/vm guest (three 4G disks, a 2G NVDIMM), and prints the wall
# time of each lifecycle step per device class. The loop backend's privileged tests
# (tests/privileged.rs) run first in the same guest, with all capabilities; csi-sanity
# runs last, on lvm, lvm-thin, pmem direct and pmem lvm, filesystem and raw block
# (tests/sanity/vm.sh on the third disk; 8 result lines).
#
#   tests/vm/backends.sh [-v] [TEST-NAME-FILTER...]   (a filter skips privileged.rs and csi-sanity)
#
# Exits non-zero if the build fails, the guest cannot run, or any test fails. The
# tests require the guest (LOCALVOL_VM_SUITE=1), so none of them can pass without
# running.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
cd "$HERE/../.."
VERBOSE=()
if [ "${1:-}" = -v ]; then VERBOSE=(-v); shift; fi

t0=${EPOCHREALTIME/./}
elapsed() { printf '%d.%01d' $(( (${EPOCHREALTIME/./} - t0) / 1000000 )) $(( (${EPOCHREALTIME/./} - t0) / 100000 % 10 )); }

target=${CARGO_TARGET_DIR:-target}
mkdir -p "$target"
# A private copy of the binaries, inside a directory the guest shares: another build
# in the same target directory cannot replace them while the guest runs.
run_dir=$(mktemp -d "$(realpath "$target")/vm-backends.XXXXXX")
build_log=$run_dir/build.log
trap 'rm -rf "$run_dir"' EXIT
if ! cargo test --no-run --test vm_backends --test privileged --message-format=json-render-diagnostics \
    >"$run_dir/build.json" 2>"$build_log"; then
  cat "$build_log" >&2
  echo "tests/vm/backends.sh: FAIL: cannot build the test binary" >&2
  exit 1
fi
artifact() {  # artifact KIND NAME: the executable cargo reported for that target
  grep -o "\"kind\":\[\"$1\"\],[^}]*\"name\":\"$2\".*\"executable\":\"[^\"]*\"" "$run_dir/build.json" |
    sed 's/.*"executable":"\([^"]*\)"/\1/' | tail -n 1
}
for a in test:vm_backends test:privileged bin:localvol; do
  exe=$(artifact "${a%:*}" "${a#*:}")
  [ -x "$exe" ] || { cat "$build_log" >&2; echo "tests/vm/backends.sh: FAIL: no executable for $a" >&2; exit 1; }
  cp "$exe" "$run_dir/${a#*:}"
done
echo "tests/vm/backends.sh: built vm_backends, privileged, localvol ($(elapsed)s)"
privileged=$run_dir/privileged
sanity=$HERE/../sanity/vm.sh
# shellcheck source=tests/sanity/kit.sh
. "$HERE/../sanity/kit.sh"
if [ $# -gt 0 ]; then
  privileged=true sanity=true   # a filter selects vm_backends tests only
elif ! sanity_kit "csi-sanity (VM: lvm, lvm-thin, pmem, pmem-lvm)"; then
  sanity=true
fi

run_log=$run_dir/run.log
# In the guest: privileged.rs on a scratch ext4 (/dev/vdc; the guest's /tmp is a
# small tmpfs), then vm_backends.rs, which takes /dev/vda, /dev/vdb and the NVDIMM,
# then csi-sanity on /dev/vdc and the NVDIMM's remaining space, timed.
cat >"$run_dir/guest.sh" <<'GUEST'
set -e
privileged=$1 sanity=$2; shift 2
if [ "$privileged" != true ]; then
  mkfs.ext4 -q /dev/vdc && mkdir -p /mnt/scratch && mount /dev/vdc /mnt/scratch
  TMPDIR=/mnt/scratch "$privileged" --test-threads=1
  umount /mnt/scratch
fi
rc=0
"$@" || rc=$?
if [ "$sanity" != true ]; then
  t=$SECONDS
  "$sanity" /dev/vdc || rc=1
  echo "csi-sanity wall time in the guest: $((SECONDS - t))s"
fi
exit $rc
GUEST
set +e
LOCALVOL_VM_SUITE=1 LOCALVOL_BIN=$run_dir/localvol RUST_LOG=${RUST_LOG:-warn} "$HERE/run.sh" "${VERBOSE[@]}" \
  --disks 3 --disk-size 4G --pmem-size 2G --mem 1G --timeout 3600 \
  -- bash "$run_dir/guest.sh" "$privileged" "$sanity" "$run_dir/vm_backends" --test-threads=1 --nocapture "$@" \
  2>&1 | tee "$run_log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" = 0 ] && { ! grep -q '^test result: ok\. [1-9]' "$run_log" || grep -q '^test result: FAILED' "$run_log"; }; then
  rc=1   # exit 0 without a passing run of at least one test is not a pass
fi
if [ "$sanity" != true ] && [ "$(grep -c '^csi-sanity .*: PASS$' "$run_log")" != 8 ]; then
  rc=1   # nor is one without 8 passing csi-sanity runs
fi

echo
echo "==== step timings (wall, emulated guest)"
# (the test harness prints a test's first line after its "test NAME ... ")
grep -o 'vm-step .*' "$run_log" | sed 's/^vm-step //' || true
echo "==== test results:"
grep '^test result:' "$run_log" || echo 'no test result'
echo "==== csi-sanity:"
if [ "$sanity" = true ]; then echo "not run (a test filter, or no kube-kit)"; else
  grep -e '^csi-sanity ' -e '^    skipped on purpose' "$run_log" || echo 'no csi-sanity result'
fi
echo "==== total wall time $(elapsed)s (build, boot, tests)"
if [ "$rc" != 0 ]; then
  echo "tests/vm/backends.sh: FAIL (exit $rc)" >&2
  exit "$rc"
fi
echo "tests/vm/backends.sh: PASS"
