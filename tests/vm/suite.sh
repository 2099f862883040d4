#!/usr/bin/env bash
# tests/vm/suite.sh - every test that needs device-mapper or an NVDIMM, in two QEMU
# guests that run side by side (one core each, in effect: the tests in them are serial).
# The test binaries are built once on the host and copied into a directory the guests
# share, so another build cannot replace them while a guest runs.
#
#   tests/vm/suite.sh [-v] [PART...] [-- VM_BACKENDS_FILTER...]
#
# Parts, in the order each guest runs them (all by default; a part's storage is its own).
# Which lane runs a part, and the classes of backends, hostile, encryption's csi-sanity
# and sanity in each mode, are tests/plan.yaml's (vm:; `plan show`):
#   guest A (four 4G disks, a 2G NVDIMM), the shorter: tests/all.sh boots the guest
#   cluster once it is done:
#     smoke       tests/vm/smoke.sh's guest steps (LVM thick/thin, PMEM labels, fsdax, dax)
#                 on /dev/vda and region0, after its host steps (exit codes, parallel runs)
#     privileged  tests/privileged.rs (loop backend, all capabilities), TMPDIR on /dev/vdc
#     backends    tests/vm_backends.rs on /dev/vda, /dev/vdb and the NVDIMM; its
#                 step-by-step kills on vm.restart's classes
#   guest B (four 4G disks, a 2G NVDIMM), the longer: it runs beside the guest cluster,
#   which starts after guest A:
#     encryption  tests/vm_backends.rs' encrypted_* tests (LUKS2 on every class that holds
#                 it, filesystem and block, a key rotation, copies, a daemon SIGKILL) on
#                 /dev/vda, /dev/vdb and the NVDIMM, emptied again by guest-storage release,
#                 then csi-sanity on encrypted volumes on /dev/vdc and the NVDIMM, of
#                 vm.sanity.encrypted's classes (tests/sanity/vm.sh --encrypted, a
#                 result line per run)
#     crash       tests/crash_vm.rs: random SIGKILLs on lvm, lvm-thin, pmem (/dev/vda, NVDIMM)
#     reclaim     tests/reclaim_privileged.rs lvm_thin on /dev/vdb
#     hostile     tests/hostile_vm.rs on vm.hostile's classes
#                 (/dev/vdb, the NVDIMM)
#     grow        tests/vm_grow.rs: lvm-thin restores and clones larger than their
#                 source, grown at stage (/dev/vdd)
#     sanity      csi-sanity on vm.sanity.fs's classes as filesystems, and on
#                 vm.sanity.block's as raw block (/dev/vdc, what is left of the NVDIMM):
#                 tests/sanity/vm.sh, a result line per run
#   The lanes are balanced for tests/all.sh, where guest A is followed by the guest
#   cluster on the core it frees: A about 570 s, B about 960 s (tests/plan.yaml's budgets).
#
# A part passes only on its own evidence: exit 0 and, for a test binary, a
# "test result: ok." line with at least one passed test and none FAILED; for sanity, one
# PASS line per run. Exits non-zero when any selected part did not pass, or did not run.
# LOCALVOL_VM_NICE (default 0) runs the guests at that nice level (tests/all.sh runs
# them beside the cluster suite).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
cd "$HERE/../.."

# shellcheck source=tests/plan/plan.sh
. "$HERE/../plan/plan.sh"
# The lanes' parts, and how many csi-sanity runs the sanity and encryption parts must
# show, in this mode (LOCALVOL_FULL, LOCALVOL_SOAK, and a person's LOCALVOL_SELECT):
# tests/plan.yaml's vm, which says why CI runs one class of each backend. The tests and
# tests/sanity/vm.sh ask the plan for their classes themselves, the same way.
plan_words LANE_A get vm.lanes.A
plan_words LANE_B get vm.lanes.B
words() { plan get "$1" | wc -w; }
sanity_runs=$(( $(words vm.sanity.fs) + $(words vm.sanity.block) ))
encrypted_sanity_runs=$(( $(words vm.sanity.encrypted.fs) + $(words vm.sanity.encrypted.block) ))
DEFAULT_PARTS=("${LANE_A[@]}" "${LANE_B[@]}")
VERBOSE=()
parts=() filter=()
while [ $# -gt 0 ]; do
  case $1 in
    -v) VERBOSE=(-v) ;;
    --) shift; filter=("$@"); break ;;
    *) [[ " ${LANE_A[*]} ${LANE_B[*]} " == *" $1 "* && $1 != *" "* ]] ||
         { echo "tests/vm/suite.sh: unknown part $1 (${LANE_A[*]} ${LANE_B[*]})" >&2; exit 2; }
       parts+=("$1") ;;
  esac
  shift
done
[ ${#parts[@]} -gt 0 ] || parts=("${DEFAULT_PARTS[@]}")
selected() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

t0=${EPOCHREALTIME/./}
elapsed() { echo $(( (${EPOCHREALTIME/./} - t0) / 1000000 )); }

# ---------------------------------------------------------------- build on the host
target=${CARGO_TARGET_DIR:-target}
mkdir -p "$target"
run_dir=$(mktemp -d "$(realpath "$target")/vm-suite.XXXXXX")
trap 'rm -rf "$run_dir"' EXIT
if ! cargo test --locked --no-run --test vm_backends --test privileged --test crash_vm \
    --test reclaim_privileged --test hostile_vm --test vm_grow --message-format=json-render-diagnostics \
    >"$run_dir/build.json" 2>"$run_dir/build.log" ||
  ! cargo build --locked -p localvol-testkit --bin guest-storage --message-format=json-render-diagnostics \
    >>"$run_dir/build.json" 2>>"$run_dir/build.log"; then
  cat "$run_dir/build.log" >&2
  echo "tests/vm/suite.sh: FAIL: cannot build the test binaries" >&2
  exit 1
fi
artifact() {  # artifact KIND NAME: the executable cargo reported for that target
  grep -o "\"kind\":\[\"$1\"\],[^}]*\"name\":\"$2\".*\"executable\":\"[^\"]*\"" "$run_dir/build.json" |
    sed 's/.*"executable":"\([^"]*\)"/\1/' | tail -n 1
}
for a in test:vm_backends test:privileged test:crash_vm test:reclaim_privileged test:hostile_vm test:vm_grow bin:localvol bin:guest-storage; do
  exe=$(artifact "${a%:*}" "${a#*:}")
  [ -x "$exe" ] || { cat "$run_dir/build.log" >&2; echo "tests/vm/suite.sh: FAIL: no executable for $a" >&2; exit 1; }
  cp "$exe" "$run_dir/${a#*:}"
done
echo "tests/vm/suite.sh: built the test binaries ($(elapsed)s)"

sanity_ok=1
# The parts that run csi-sanity: sanity, and encryption's encrypted runs.
needs_sanity() { [ "$1" = sanity ] || [ "$1" = encryption ]; }
if selected sanity || selected encryption; then
  # shellcheck source=tests/sanity/kit.sh
  . "$HERE/../sanity/kit.sh"
  sanity_kit "csi-sanity (VM: lvm, lvm-thin, pmem, pmem-lvm, plain and encrypted; encrypted loop)" || sanity_ok=0
fi

# ---------------------------------------------------------------- the parts, in a guest
# part_cmd NAME: the command line (bash words) that runs part NAME in the guest.
part_cmd() {
  local r=$run_dir
  case $1 in
    smoke) echo "bash $HERE/smoke.sh" ;;
    privileged) echo "bash -c 'mkfs.ext4 -q -F /dev/vdc && mkdir -p /mnt/scratch && mount /dev/vdc /mnt/scratch && rc=0 && { TMPDIR=/mnt/scratch $r/privileged --test-threads=1 || rc=\$?; } && umount /mnt/scratch && exit \$rc'" ;;
    backends) echo "$r/vm_backends --test-threads=1 --nocapture --skip encrypted_ ${filter[*]:-}" ;;
    # Its storage (vm_backends' VGs and the region's namespace) is removed after it.
    encryption) echo "bash -c '$r/vm_backends --test-threads=1 --nocapture encrypted_; rc=\$?; $r/guest-storage release || rc=1; bash $HERE/../sanity/vm.sh --encrypted $r/guest-storage /dev/vdc || rc=1; $r/guest-storage release || rc=1; exit \$rc'" ;;
    hostile) echo "env LOCALVOL_VM_DISK=/dev/vdb $r/hostile_vm --test-threads=1 --nocapture" ;;
    grow) echo "env LOCALVOL_VM_DISK=/dev/vdd $r/vm_grow --test-threads=1 --nocapture" ;;
    crash) echo "$r/crash_vm --test-threads=1 --nocapture" ;;
    reclaim) echo "env LOCALVOL_VM_DISK=/dev/vdb $r/reclaim_privileged lvm_thin --test-threads=1" ;;
    sanity) echo "bash $HERE/../sanity/vm.sh $r/guest-storage /dev/vdc" ;;
  esac
}

# write_lane NAME PART...: the guest script of one lane. Each part's output goes to the
# console and to its own log; its exit status and wall time to NAME.status.
write_lane() {
  local lane=$1 p; shift
  {
    echo "cd $PWD"
    for p in "$@"; do
      echo "echo '==== $lane: $p'; s=\$SECONDS; rc=0"
      echo "$(part_cmd "$p") > >(tee $run_dir/$p.log) 2>&1 || rc=\$?"
      echo "echo \"$p \$rc \$((SECONDS - s))\" >>$run_dir/$lane.status"
      echo "echo \"==== $lane: $p exit \$rc (\$((SECONDS - s))s)\""
    done
  } >"$run_dir/$lane.sh"
}

lanes=()
for lane in A B; do
  declare -n members=LANE_$lane
  chosen=()
  for p in "${members[@]}"; do
    selected "$p" && { ! needs_sanity "$p" || [ "$sanity_ok" = 1 ]; } && chosen+=("$p")
  done
  if [ ${#chosen[@]} -gt 0 ]; then write_lane "$lane" "${chosen[@]}"; lanes+=("$lane"); fi
  unset -n members
done

failed=0
if selected smoke; then
  echo "==== smoke: host steps (exit codes, parallel guests, guest environment)"
  "$HERE/smoke.sh" --host-only "${VERBOSE[@]}" || failed=1
fi

pids=()
# Each guest's end is said when it happens, the first one's while the other still runs:
# tests/all.sh boots the cluster guest on the core it frees.
for lane in "${lanes[@]}"; do
  timeout=$(plan budget "vm_${lane,,}")   # tests/plan.yaml's suites vm_a, vm_b
  (
    rc=0
    LOCALVOL_VM_SUITE=1 LOCALVOL_BIN=$run_dir/localvol RUST_LOG=${RUST_LOG:-warn} \
      nice -n "${LOCALVOL_VM_NICE:-0}" "$HERE/run.sh" "${VERBOSE[@]}" \
      --disks 4 --disk-size 4G --pmem-size 2G --mem 1G --timeout "$timeout" \
      -- bash "$run_dir/$lane.sh" > >(sed -u "s/^/[guest $lane] /") 2>&1 || rc=$?
    echo "tests/vm/suite.sh: guest $lane exited $rc ($(elapsed)s)"
    exit "$rc"
  ) &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1   # the lane script ends with an echo: 124/125 is the guest's own failure
done

# ---------------------------------------------------------------- the verdict, per part
verdict() {  # verdict PART: PASS when the part's own evidence says so
  local p=$1 log=$run_dir/$1.log line
  line=$(cat "$run_dir"/*.status 2>/dev/null | awk -v p="$p" '$1 == p' | tail -n 1)
  [ -n "$line" ] || { echo "did not run"; return 1; }
  set -- $line
  [ "$2" = 0 ] || { echo "exit $2 (${3}s)"; return 1; }
  case $p in
    privileged|backends|hostile|grow|crash|reclaim)
      if ! grep -q '^test result: ok\. [1-9]' "$log" || grep -q '^test result: FAILED' "$log"; then
        echo "no passing test result (${3}s)"; return 1
      fi ;;
    sanity)
      [ "$(grep -c '^csi-sanity .*: PASS$' "$log")" = "$sanity_runs" ] || { echo "not $sanity_runs passing csi-sanity runs (${3}s)"; return 1; } ;;
    encryption)
      if ! grep -q '^test result: ok\. [1-9]' "$log" || grep -q '^test result: FAILED' "$log" ||
         [ "$(grep -c '^csi-sanity .*+luks2 .*: PASS$' "$log")" != "$encrypted_sanity_runs" ]; then
        echo "no passing test result, or not $encrypted_sanity_runs passing encrypted csi-sanity runs (${3}s)"; return 1
      fi ;;
  esac
  echo "${3}s"
}
echo
echo "==== tests/vm/suite.sh: step timings (wall, emulated guest)"
for p in "${parts[@]}"; do
  [ -f "$run_dir/$p.log" ] && grep -o 'vm-step .*' "$run_dir/$p.log" | sed 's/^vm-step //' || true
done
if selected sanity && [ -f "$run_dir/sanity.log" ]; then
  grep -e '^csi-sanity ' -e '^    skipped on purpose' "$run_dir/sanity.log" || true
fi
echo "==== tests/vm/suite.sh: parts"
for p in "${parts[@]}"; do
  if needs_sanity "$p" && [ "$sanity_ok" = 0 ]; then
    printf '%-13s FAIL  no csi-sanity (kube-kit)\n' "$p"; failed=1; continue
  fi
  if v=$(verdict "$p"); then printf '%-13s PASS  %s\n' "$p" "$v"
  else printf '%-13s FAIL  %s\n' "$p" "$v"; failed=1; fi
done
echo "==== total wall time $(elapsed)s (build, boots, tests)"
if [ "$failed" != 0 ]; then
  echo "tests/vm/suite.sh: FAIL (logs: rerun a part alone, e.g. tests/vm/suite.sh -v ${parts[0]})" >&2
  exit 1
fi
echo "tests/vm/suite.sh: PASS"
