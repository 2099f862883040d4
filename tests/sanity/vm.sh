#!/usr/bin/env bash
# tests/sanity/vm.sh [--encrypted] GUEST_STORAGE DISK - csi-sanity on the LVM and PMEM classes, in the
# tests/vm guest: lvm (thick), lvm-thin, pmem direct and pmem lvm, each as filesystem and
# raw block (up to 8 runs of tests/sanity/run.sh, one result line each). With --encrypted,
# instead: encrypted volumes (localvol.csi.dev/encryption: luks2 with a node-stage
# secret), which need dm-crypt, on lvm as filesystem and on loop, lvm-thin and pmem-lvm
# as block (up to 4 runs, labelled CLASS+luks2; tests/vm/suite.sh's part encryption). Run by tests/vm/suite.sh (part sanity), after
# tests/crash_vm.rs and the reclaim test in the same guest.
#
# It makes its own storage, beside whatever the backend suite left, with the testkit's
# guest-storage (localvol_testkit::guest::sanity, which says what it makes, the classes'
# configuration and the volume sizes each class holds exactly). GUEST_STORAGE is its
# binary, built on the host (tests/vm/suite.sh passes its copy).
# Exit status: 0 when every run passed; 1 otherwise (each run still runs).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
encrypted=0
if [ "${1:-}" = --encrypted ]; then encrypted=1; shift; fi
usage="usage: tests/sanity/vm.sh [--encrypted] GUEST_STORAGE DISK"
guest_storage=${1:?$usage}
disk=${2:?$usage}
[ "${VMTEST_GUEST:-}" = 1 ] || { echo "tests/sanity/vm.sh: only in the tests/vm guest (it wipes $disk)" >&2; exit 1; }
t0=${EPOCHREALTIME/./}
secs() { local t=$(( (${EPOCHREALTIME/./} - $1) / 100000 )); echo "$((t / 10)).$((t % 10))"; }

# ---- storage, configuration, and each class's sizes
config=$(mktemp "${TMPDIR:-/tmp}/sanity-classes.XXXXXX.yaml")
loop_dir=$(mktemp -d "${TMPDIR:-/tmp}/sanity-loop.XXXXXX")
sizes=$("$guest_storage" sanity "$disk" "$config" "$loop_dir") || { echo "tests/sanity/vm.sh: cannot make the storage" >&2; exit 1; }
declare -A size=() expand=()
while read -r class bytes grown; do size[$class]=$bytes expand[$class]=$grown; done <<<"$sizes"
[ ${#size[@]} = 5 ] || { echo "tests/sanity/vm.sh: guest-storage sanity printed: $sizes" >&2; exit 1; }
echo "csi-sanity setup: $(secs "$t0")s"

# pmem direct volumes cannot grow (docs/backends.md, "PMEM direct: no expansion"): the two
# specs that grow a volume cannot pass on that class, every other one must.
pmem_skip='ExpandVolume \[Controller Server\] should work$|NodeExpandVolume should work if node-expand is called after node-publish'
pmem_why='pmem direct volumes cannot grow: ControllerExpandVolume is OUT_OF_RANGE, the class documents allowVolumeExpansion: false'

# Snapshots and clones are made by loop and lvm-thin classes only (docs/backends.md,
# "Snapshots and clones"): on lvm and pmem CreateSnapshot and CreateVolume from a source are
# INVALID_ARGUMENT by design, so the specs that need one to succeed are skipped there. The
# specs that check refusals, missing sources and unknown ids still run and must pass.
# lvm-thin runs every spec.
snap_skip='CreateSnapshot .*(maximum-length name|already existing name)|DeleteSnapshot .*should return appropriate values|ListSnapshots .*(check the presence|appropriate values|next token|that match the specified)|create volume from an existing source (snapshot|volume)'
thick_why='lvm and pmem make no snapshots or clones (only a full copy could): CreateSnapshot and CreateVolume from a source are INVALID_ARGUMENT'
failed=0
runs=0
# Which runs: plain volumes of the plan's vm.sanity.fs classes as filesystems and
# vm.sanity.block's as raw block; with --encrypted, vm.sanity.encrypted's. In the run's
# mode (LOCALVOL_FULL: every run), with a person's LOCALVOL_SELECT.
key=vm.sanity encrypt=()
if [ $encrypted = 1 ]; then key=vm.sanity.encrypted encrypt=(--encrypt); fi
# shellcheck source=tests/plan/plan.sh
. "$HERE/../plan/plan.sh"
fs_classes=" $(plan get "$key.fs") "
block_classes=" $(plan get "$key.block") "
sanity() {  # sanity CLASS ACCESS ARGS...: one run of tests/sanity/run.sh, if it was asked for
  local class=$1 access=$2 wanted
  shift 2
  wanted=$fs_classes
  [ "$access" = mount ] || wanted=$block_classes
  [[ $wanted == *" $class "* ]] || return 0
  runs=$((runs + 1))
  "$HERE/run.sh" --config "$config" --class "$class" --access "$access" "${encrypt[@]}" \
    --size "${size[$class]}" --expand-size "${expand[$class]}" "$@" || failed=1
}
for access in mount block; do
  sanity lvm $access --skip "$snap_skip" --why "$thick_why"
  sanity lvm-thin $access
  [ $encrypted = 1 ] || sanity pmem $access --skip "$pmem_skip|$snap_skip" --why "$pmem_why; $thick_why"
  sanity pmem-lvm $access --skip "$snap_skip" --why "$thick_why"
  [ $encrypted = 0 ] || sanity loop $access
done
echo "csi-sanity: $runs runs (filesystem:$fs_classes; block:$block_classes)"
echo "csi-sanity guest total: $(secs "$t0")s"
exit $failed
