#!/usr/bin/env bash
# tests/sanity/vm.sh [--encrypted] DISK - csi-sanity on the LVM and PMEM classes, in the
# tests/vm guest: lvm (thick), lvm-thin, pmem direct and pmem lvm, each as filesystem and
# raw block (up to 8 runs of tests/sanity/run.sh, one result line each). With --encrypted,
# instead: encrypted volumes (localvol.csi.dev/encryption: luks2 with a node-stage
# secret), which need dm-crypt, on lvm as filesystem and on loop, lvm-thin and pmem-lvm
# as block (up to 4 runs, labelled CLASS+luks2; tests/vm/suite.sh's part encryption). Run by tests/vm/suite.sh (part sanity), after
# tests/crash_vm.rs and the reclaim test in the same guest.
#
# It makes its own storage, beside whatever the backend suite left: VG sanityvg on DISK
# (wiped) with the zeroing thin pool sanitypool, and on region0 one fsdax namespace holding
# VG sanitypmemvg (region0's labels are initialised first when nothing did that yet).
# Every class's sizes come from the class: whole extents of its VG (vgs vg_extent_size),
# and for pmem direct the usable sizes of real fsdax namespaces made here and destroyed.
# Optional CLASS arguments (lvm, lvm-thin, pmem, pmem-lvm, loop) run only those classes'
# runs; the default is all of them. The classes' new LUKS headers use a cheap key
# derivation (luks: in the config): csi-sanity stages dozens of volumes, and what it
# checks is the CSI calls, not argon2id's cost (tests/vm_backends.rs runs the default).
# Exit status: 0 when every run passed; 1 otherwise (each run still runs).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
encrypted=0
if [ "${1:-}" = --encrypted ]; then encrypted=1; shift; fi
disk=${1:?usage: tests/sanity/vm.sh [--encrypted] DISK [CLASS...]}
shift
classes=" ${*:-lvm lvm-thin pmem pmem-lvm loop} "
for c in $classes; do
  case $c in lvm | lvm-thin | pmem | pmem-lvm | loop) ;; *) echo "tests/sanity/vm.sh: unknown class $c" >&2; exit 2 ;; esac
done
[ "${VMTEST_GUEST:-}" = 1 ] || { echo "tests/sanity/vm.sh: only in the tests/vm guest (it wipes $disk)" >&2; exit 1; }
region=region0 nmem=nmem0
t0=${EPOCHREALTIME/./}
secs() { local t=$(( (${EPOCHREALTIME/./} - $1) / 100000 )); echo "$((t / 10)).$((t % 10))"; }

json_num() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" | head -n 1; }
json_str() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p" | head -n 1; }

# ---- storage
wipefs -q -a "$disk"
pvcreate -q "$disk" >/dev/null
vgcreate -q sanityvg "$disk" >/dev/null
lvcreate -q -y -T sanityvg/sanitypool -L 512M -Zy >/dev/null
# A region whose labels nobody initialised holds one label-less raw namespace and
# offers nothing to create-namespace.
if [ "$(ndctl list -r "$region" | tr -d ' \n' | json_num available_size)" = 0 ]; then
  ndctl disable-region "$region" >/dev/null
  ndctl init-labels -f "$nmem" >/dev/null
  ndctl enable-region "$region" >/dev/null
fi
create_ns() {  # create_ns RAW NAME: prints the new namespace's JSON (numeric sizes) on one line
  ndctl create-namespace -r "$region" -m fsdax -M dev -s "$1" -n "$2" >/dev/null
  ndctl list -N -r "$region" | tr -d ' \n' | sed 's/},{/}\n{/g' | grep "\"name\":\"$2\""
}
ns=$(create_ns 256M sanity-pmemvg)
pmem_dev=/dev/$(json_str blockdev <<<"$ns")
wipefs -q -a "$pmem_dev"   # a new namespace shows whatever earlier tests left on the media
pvcreate -q "$pmem_dev" >/dev/null
vgcreate -q sanitypmemvg "$pmem_dev" >/dev/null

# ---- sizes each class holds exactly
extent() { vgs --noheadings --units b --nosuffix -o vg_extent_size "$1" | tr -d ' '; }
lvm_extent=$(extent sanityvg)
pmem_lvm_extent=$(extent sanitypmemvg)
# What an fsdax namespace of RAW bytes offers, measured by making one.
ns_usable() {
  local j; j=$(create_ns "$1" sanity-probe)
  ndctl destroy-namespace -f "$(json_str dev <<<"$j")" >/dev/null 2>&1
  json_num size <<<"$j"
}
region_align=$(ndctl list -r "$region" | tr -d ' \n' | json_num align)
pmem_size=$(ns_usable $((5 * region_align)))
pmem_expand=$(ns_usable $((10 * region_align)))
[ -n "$lvm_extent" ] && [ -n "$pmem_lvm_extent" ] && [ -n "$pmem_size" ] && [ -n "$pmem_expand" ] \
  || { echo "tests/sanity/vm.sh: cannot read the extent sizes or a namespace's size" >&2; exit 1; }
echo "csi-sanity sizes: lvm, lvm-thin: 16 and 32 extents of $lvm_extent;" \
  "pmem-lvm: 16 and 32 extents of $pmem_lvm_extent;" \
  "pmem: fsdax namespaces of $((5 * region_align)) and $((10 * region_align)) bytes offer $pmem_size and $pmem_expand"

config=$(mktemp "${TMPDIR:-/tmp}/sanity-classes.XXXXXX.yaml")
loop_dir=$(mktemp -d "${TMPDIR:-/tmp}/sanity-loop.XXXXXX")
cheap='luks: {pbkdf-memory-kib: 8192, iter-time-ms: 50}'
cat >"$config" <<EOF
device-classes:
  - {name: lvm, kind: lvm, volume-group: sanityvg, spare-gb: 0, default: true, $cheap}
  - {name: lvm-thin, kind: lvm-thin, volume-group: sanityvg, thin-pool: {name: sanitypool, overprovision-ratio: 1.0}, $cheap}
  - {name: pmem, kind: pmem, mode: direct, region: $region}
  - {name: pmem-lvm, kind: pmem, mode: lvm, volume-group: sanitypmemvg, $cheap}
  - {name: loop, kind: loop, directory: $loop_dir, capacity-gb: 2, $cheap}
EOF
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
# Which runs (tests/vm/suite.sh decides): plain volumes of the classes in
# LOCALVOL_SANITY_FS_CLASSES (filesystem) and LOCALVOL_SANITY_BLOCK_CLASSES (raw block);
# with --encrypted, LOCALVOL_SANITY_ENCRYPTED_FS_CLASSES and
# LOCALVOL_SANITY_ENCRYPTED_BLOCK_CLASSES. Alone, each one unset is the full mode's
# list in tests/plan.yaml (vm.sanity, vm.sanity.encrypted: every run).
loop_size=$((64 << 20)) loop_expand=$((128 << 20))
if [ $encrypted = 1 ]; then
  fs_var=LOCALVOL_SANITY_ENCRYPTED_FS_CLASSES block_var=LOCALVOL_SANITY_ENCRYPTED_BLOCK_CLASSES key=vm.sanity.encrypted
  encrypt=(--encrypt)
else
  fs_var=LOCALVOL_SANITY_FS_CLASSES block_var=LOCALVOL_SANITY_BLOCK_CLASSES key=vm.sanity
  encrypt=()
fi
if [ -z "${!fs_var+set}" ] || [ -z "${!block_var+set}" ]; then
  # shellcheck source=tests/plan/plan.sh
  . "$HERE/../plan/plan.sh"
  fs_default=$(plan get "$key.fs" --mode full)
  block_default=$(plan get "$key.block" --mode full)
fi
fs_classes=" ${!fs_var-$fs_default} "
block_classes=" ${!block_var-$block_default} "
sanity() {  # sanity CLASS ACCESS ARGS...: one run of tests/sanity/run.sh, if it was asked for
  local class=$1 access=$2 wanted
  shift 2
  wanted=$fs_classes
  [ "$access" = mount ] || wanted=$block_classes
  [[ $classes == *" $class "* && $wanted == *" $class "* ]] || return 0
  runs=$((runs + 1))
  "$HERE/run.sh" --config "$config" --class "$class" --access "$access" "${encrypt[@]}" "$@" || failed=1
}
for access in mount block; do
  sanity lvm $access \
    --size $((16 * lvm_extent)) --expand-size $((32 * lvm_extent)) --skip "$snap_skip" --why "$thick_why"
  sanity lvm-thin $access \
    --size $((16 * lvm_extent)) --expand-size $((32 * lvm_extent))
  [ $encrypted = 1 ] || sanity pmem $access \
    --size "$pmem_size" --expand-size "$pmem_expand" --skip "$pmem_skip|$snap_skip" --why "$pmem_why; $thick_why"
  sanity pmem-lvm $access \
    --size $((16 * pmem_lvm_extent)) --expand-size $((32 * pmem_lvm_extent)) --skip "$snap_skip" --why "$thick_why"
  [ $encrypted = 0 ] || sanity loop $access --size $loop_size --expand-size $loop_expand
done
echo "csi-sanity: $runs runs of classes:$classes"
echo "csi-sanity guest total: $(secs "$t0")s"
exit $failed
