#!/usr/bin/env bash
# tests/vm/release-storage.sh - in the guest: gives back what tests/vm_backends.rs and
# tests/sanity/vm.sh made (VGs vmvg and pmemvg on /dev/vda, /dev/vdb and an fsdax
# namespace of region0; sanityvg on /dev/vdc, sanitypmemvg on a namespace), even
# after a failed test left volumes mounted or encrypted mappings open, so that the next
# part of the same guest finds empty disks and an empty region.
#
#   tests/vm/release-storage.sh
set -uo pipefail
vgs=(vmvg pmemvg sanityvg sanitypmemvg)
# Mounts of the VGs' LVs and of localvol's encrypted mappings, deepest first.
findmnt -rn -o TARGET,SOURCE | awk '$2 ~ /^\/dev\/mapper\/(vmvg|pmemvg|sanityvg|sanitypmemvg|localvol-crypt-)/ {print $1}' \
  | sort -r | while read -r target; do umount -l "$target"; done
for m in /dev/mapper/localvol-crypt-*; do
  [ -e "$m" ] && DM_DISABLE_UDEV=1 cryptsetup close "${m##*/}"
done
vgremove -q -y -ff "${vgs[@]}" >/dev/null 2>&1
wipefs -q -a /dev/vda /dev/vdb /dev/vdc
ndctl destroy-namespace -f all -r region0 >/dev/null 2>&1
for vg in "${vgs[@]}"; do
  if vgs "$vg" >/dev/null 2>&1; then echo "tests/vm/release-storage.sh: $vg is still there" >&2; exit 1; fi
done
