#!/usr/bin/env bash
# tests/vm/smoke.sh - self-test of tests/vm/run.sh: exit codes, output
# streaming and parallel runs on the host, then LVM (thick, thin, ext4, xfs)
# and PMEM (labels, fsdax namespaces, mount -o dax) inside one guest.
# Prints PASS/FAIL per step; exits non-zero if any step failed.
#
#   tests/vm/smoke.sh [--host-only] [run.sh options, e.g. -v]
#
# --host-only skips the guest part's own boot: tests/vm/suite.sh runs that part (this
# script, in the guest) first in one of its guests.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
FAILED=0

step() {  # step NAME FUNCTION: run FUNCTION with errexit, print PASS/FAIL and its time
  local name=$1 t0=${EPOCHREALTIME/./} log
  log=$(mktemp)
  # Not `if (...)` or `(...) ||`: there, bash would ignore set -e in the subshell.
  (set -e; "$2") >"$log" 2>&1
  # shellcheck disable=SC2181
  if [ $? = 0 ]; then
    printf 'PASS  %-52s %5.1fs\n' "$name" "$(((${EPOCHREALTIME/./} - t0) / 1000))e-3"
    grep '^note: ' "$log" | sed 's/^note: /      /'
  else
    printf 'FAIL  %-52s %5.1fs\n' "$name" "$(((${EPOCHREALTIME/./} - t0) / 1000))e-3"
    sed 's/^/      | /' "$log" | tail -n 20
    FAILED=$((FAILED + 1))
  fi
  rm -f "$log"
}

# ------------------------------------------------------------ in the guest
vg_create() { pvcreate /dev/vda; vgcreate vg0 /dev/vda; }

thick_ext4() {
  lvcreate -y -n thick -L 64M vg0
  mkfs.ext4 -q /dev/vg0/thick
  mount /dev/vg0/thick /mnt/a
  echo data >/mnt/a/f
  lvextend -L 128M vg0/thick
  resize2fs /dev/vg0/thick
  local mib; mib=$(df -BM --output=size /mnt/a | tail -n 1 | tr -dc 0-9)
  echo "note: ext4 on a thick LV, online grow 64M -> ${mib}M"
  [ "$mib" -gt 100 ]
  grep -q data /mnt/a/f
  umount /mnt/a
}

thin_xfs() {
  lvcreate -y -T vg0/pool -L 512M
  lvcreate -y -T vg0/pool -n thin -V 1G
  mkfs.xfs -q /dev/vg0/thin
  mount /dev/vg0/thin /mnt/b
  dd if=/dev/urandom of=/mnt/b/f bs=1M count=8 status=none
  sync
  local pct; pct=$(lvs --noheadings -o data_percent vg0/pool | tr -d ' ')
  echo "note: xfs on a thin LV, pool data_percent $pct after writing 8M"
  awk -v p="$pct" 'BEGIN { exit !(p > 0) }'
  umount /mnt/b
}

lv_remove() {
  lvremove -y vg0
  vgremove vg0
  pvremove -q /dev/vda   # the next test in this guest gets a blank disk
  [ ! -e /dev/vg0 ]
}

pmem_labels() {
  ndctl disable-region region0
  ndctl init-labels -f nmem0
  ndctl enable-region region0
  ndctl list -R -r region0 | grep '"available_size"'
}

# The first namespace of region0 is /dev/pmem0, the next ones /dev/pmem0.1, ...
pmem_namespaces() {
  local PMEM=()
  for size in 128M 320M; do   # xfs: mkfs.xfs >= 5.19 refuses less than 300 MB
    ndctl create-namespace -r region0 -m fsdax -s $size -n smoke-$size >/tmp/ns.json
    grep -q '"mode":"fsdax"' /tmp/ns.json
    PMEM+=("/dev/$(sed -n 's/.*"blockdev":"\(.*\)".*/\1/p' /tmp/ns.json)")
  done
  [ -b "${PMEM[0]}" ]
  [ -b "${PMEM[1]}" ]
  echo "note: two fsdax namespaces: ${PMEM[*]}"
  printf '%s\n' "${PMEM[@]}" >/tmp/pmem.devs   # steps run in subshells
}

pmem_dax() {
  mapfile -t PMEM </tmp/pmem.devs
  mkfs.ext4 -q -b 4096 "${PMEM[0]}"   # small fs default to 1K blocks: no DAX
  mount -o dax "${PMEM[0]}" /mnt/a
  mkfs.xfs -q "${PMEM[1]}"   # reflink (default) + dax works on 6.1 (EXPERIMENTAL warning)
  mount -o dax "${PMEM[1]}" /mnt/b
  grep -E ' /mnt/[ab] ' /proc/mounts | sed 's/^/note: /'
  [ "$(grep -E ' /mnt/[ab] ' /proc/mounts | grep -c 'dax=always')" = 2 ]
  umount /mnt/a /mnt/b
}

pmem_destroy() {
  ndctl destroy-namespace -f all
  [ "$(ndctl list -N)" = "" ]
}

if [ "${VMTEST_GUEST:-}" = 1 ]; then
  mkdir -p /mnt/a /mnt/b
  step "lvm: pvcreate + vgcreate on /dev/vda" vg_create
  step "lvm: thick LV, ext4, lvextend + resize2fs" thick_ext4
  step "lvm: thin pool + thin LV, xfs, data_percent > 0" thin_xfs
  step "lvm: lvremove + vgremove" lv_remove
  step "pmem: disable-region, init-labels, enable-region" pmem_labels
  step "pmem: two fsdax namespaces (create-namespace -n)" pmem_namespaces
  step "pmem: ext4 and xfs mount -o dax" pmem_dax
  step "pmem: destroy-namespace all" pmem_destroy
  exit $((FAILED > 0))
fi

# ------------------------------------------------------------ on the host
T_START=${EPOCHREALTIME/./}
HOST_ONLY=0
if [ "${1:-}" = --host-only ]; then HOST_ONLY=1; shift; fi
OPTS=("$@")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Three guests at once: also checks that parallel runs work.
exit_codes() {
  "$HERE/run.sh" "${OPTS[@]}" -- sh -c 'echo to-stdout; echo to-stderr >&2; exit 3' >"$TMP/out" 2>"$TMP/err" &
  local a=$!
  "$HERE/run.sh" "${OPTS[@]}" --timeout 2 -- sleep 60 >/dev/null 2>"$TMP/timeout.err" &
  local b=$!
  "$HERE/run.sh" "${OPTS[@]}" -- sh -c 'echo c >/proc/sysrq-trigger' >/dev/null 2>"$TMP/panic.err" &
  local c=$!
  local rc_a=0 rc_b=0 rc_c=0
  wait $a || rc_a=$?; wait $b || rc_b=$?; wait $c || rc_c=$?
  echo "note: exit 3 -> $rc_a, --timeout -> $rc_b, guest panic -> $rc_c"
  [ "$rc_a" = 3 ]
  [ "$(cat "$TMP/out")" = to-stdout ]
  [ "$(cat "$TMP/err")" = to-stderr ]
  [ "$rc_b" = 124 ]
  grep 'timed out' "$TMP/timeout.err"
  [ "$rc_c" = 125 ]
  grep 'Kernel panic' "$TMP/panic.err"
}
step "run.sh: exit status, stdout/stderr, 124, 125 (parallel)" exit_codes

guest_env() {
  local out
  # shellcheck disable=SC2016  # expanded in the guest
  out=$("$HERE/run.sh" "${OPTS[@]}" -- sh -c 'echo "$VMTEST_GUEST $DM_DISABLE_UDEV $(pwd)"; lvmconfig activation/udev_sync')
  echo "note: $out" | tr '\n' ' '; echo
  [ "$(head -n 1 <<<"$out")" = "1 1 $(pwd -P)" ]
  grep -q 'udev_sync=0' <<<"$out"
}
step "run.sh: guest env, cwd, lvm.conf udev_sync=0" guest_env

if [ "$HOST_ONLY" = 0 ]; then
  t0=${EPOCHREALTIME/./}
  "$HERE/run.sh" "${OPTS[@]}" -- "$HERE/smoke.sh"
  rc=$?
  printf 'guest part: exit %d, %.1fs wall including boot\n' "$rc" "$(((${EPOCHREALTIME/./} - t0) / 1000))e-3"
  [ "$rc" = 0 ] || FAILED=$((FAILED + 1))
fi
printf 'smoke: %s, %.1fs in total\n' "$([ "$FAILED" = 0 ] && echo 'all passed' || echo "$FAILED failed")" \
  "$(((${EPOCHREALTIME/./} - T_START) / 1000))e-3"
[ "$FAILED" = 0 ]
