#!/usr/bin/env bash
# tests/sanity/run.sh - one csi-sanity (kubernetes-csi/csi-test) run against a fresh
# `localvol serve`, for one device class and one access type; prints one result line.
#
#   tests/sanity/run.sh --access mount|block --size BYTES --expand-size BYTES
#       [--class NAME] [--config FILE] [--skip REGEX --why TEXT] [--label TEXT] [--encrypt]
#
#   --class        the StorageClass parameter localvol.csi.dev/device-class (default: the
#                  daemon's default class)
#   --config       the daemon's --config (device classes); without it, the embedded loop class
#   --size         --csi.testvolumesize: must be a size the class holds exactly (csi-sanity asks
#                  for required_bytes = limit_bytes in some specs)
#   --expand-size  --csi.testvolumeexpandsize, the same rule
#   --skip, --why  a --ginkgo.skip regex and the reason, printed next to the result
#   --encrypt      volumes with localvol.csi.dev/encryption: luks2, and a node-stage secret
#                  (--csi.secrets) holding their passphrase (docs/encryption.md)
#
# The daemon runs with --kube off, its socket and data under a fresh temporary root, and
# --kubelet-root-dir THAT_ROOT/kubelet, under which csi-sanity's staging and target
# directories are made: path confinement allows exactly them.
# Environment: LOCALVOL_BIN (default target/debug/localvol), CSI_SANITY (default
# $KUBE_KIT_BIN/csi-sanity-master, KUBE_KIT_BIN default /var/cache/kube-kit/bin),
# SANITY_LOG_DIR (keep csi-sanity's and the daemon's output there; default: printed
# only on failure).
# Exit status: 0 when csi-sanity ran, reported its summary and 0 failures; 1 otherwise.
set -euo pipefail

class='' config='' access='' size='' expand='' skip='' why='' label='' encrypt=''
while [ $# -gt 0 ]; do
  case "$1" in
    --class) class=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --access) access=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --expand-size) expand=$2; shift 2 ;;
    --skip) skip=$2; shift 2 ;;
    --why) why=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --encrypt) encrypt=1; shift ;;
    *) echo "tests/sanity/run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$access" in mount|block) ;; *) echo "tests/sanity/run.sh: --access mount|block" >&2; exit 2 ;; esac
[[ "$size" =~ ^[0-9]+$ && "$expand" =~ ^[0-9]+$ ]] || { echo "tests/sanity/run.sh: --size and --expand-size in bytes" >&2; exit 2; }
[ -z "$skip" ] || [ -n "$why" ] || { echo "tests/sanity/run.sh: --skip needs --why" >&2; exit 2; }
label=${label:-${class:-default}}${encrypt:++luks2}

bin=${LOCALVOL_BIN:-target/debug/localvol}
sanity=${CSI_SANITY:-${KUBE_KIT_BIN:-/var/cache/kube-kit/bin}/csi-sanity-master}
[ -x "$bin" ] || { echo "tests/sanity/run.sh: no localvol binary at $bin (set LOCALVOL_BIN)" >&2; exit 1; }
[ -x "$sanity" ] || { echo "tests/sanity/run.sh: no csi-sanity at $sanity (set CSI_SANITY)" >&2; exit 1; }

root=$(mktemp -d "${TMPDIR:-/tmp}/localvol-sanity.XXXXXX")
log_dir=${SANITY_LOG_DIR:-$root}
# csi-sanity makes the mount and staging directories themselves, not their parents.
mkdir -p "$root/kubelet/pods/sanity" "$root/kubelet/plugins/sanity" "$root/data" "$log_dir"
tag=$label-$access
out=$log_dir/csi-sanity-$tag.log
daemon_log=$log_dir/localvol-$tag.log
daemon=''
cleanup() {
  set +e
  if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; fi
  # What a failed spec left mounted under the root, deepest first.
  findmnt -rn -o TARGET | grep "^$root/" | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$root"
}
trap cleanup EXIT

args=(serve --endpoint "unix://$root/csi.sock" --data-dir "$root/data" --kube off
      --kubelet-root-dir "$root/kubelet" --registration-dir "$root/no-kubelet"
      --metrics-addr 127.0.0.1:0)
[ -z "$config" ] || args+=(--config "$config")
RUST_LOG=${RUST_LOG:-warn} "$bin" "${args[@]}" >"$daemon_log" 2>&1 &
daemon=$!
for _ in $(seq 300); do
  [ -S "$root/csi.sock" ] && break
  kill -0 "$daemon" 2>/dev/null || break
  sleep 0.1
done
if [ ! -S "$root/csi.sock" ]; then
  cat "$daemon_log" >&2
  echo "csi-sanity $label $access: FAIL: localvol did not start (above: its output)"
  exit 1
fi

params=$root/parameters.yaml
if [ -n "$class" ]; then echo "localvol.csi.dev/device-class: $class" >"$params"; else : >"$params"; fi
sanity_args=(--csi.endpoint="$root/csi.sock" --csi.mountdir="$root/kubelet/pods/sanity/mount"
  --csi.stagingdir="$root/kubelet/plugins/sanity/staging" --csi.testvolumeparameters="$params"
  --csi.testvolumesize="$size" --csi.testvolumeexpandsize="$expand"
  --csi.testvolumeaccesstype="$access" --ginkgo.no-color --ginkgo.timeout=30m)
[ -z "$skip" ] || sanity_args+=(--ginkgo.skip="$skip")
if [ -n "$encrypt" ]; then
  echo "localvol.csi.dev/encryption: luks2" >>"$params"
  secrets=$root/secrets.yaml
  printf 'NodeStageVolumeSecret:\n  passphrase: %s\n' "sanity-$RANDOM-$RANDOM" >"$secrets"
  sanity_args+=(--csi.secrets="$secrets")
fi

t0=${EPOCHREALTIME/./}
rc=0
"$sanity" "${sanity_args[@]}" >"$out" 2>&1 || rc=$?
wall=$(( (${EPOCHREALTIME/./} - t0) / 100000 ))
wall="$((wall / 10)).$((wall % 10))s"

# Ginkgo's summary: "Ran 49 of 96 Specs in 31.2 seconds" and
# "SUCCESS! -- 49 Passed | 0 Failed | 0 Pending | 47 Skipped" (FAIL! on failures).
ran=$(sed -n 's/^Ran \([0-9]*\) of \([0-9]*\) Specs.*/\1 \2/p' "$out" | tail -n 1)
counts=$(sed -n 's/.* \([0-9]*\) Passed | \([0-9]*\) Failed | \([0-9]*\) Pending | \([0-9]*\) Skipped.*/\1 \2 \3 \4/p' "$out" | tail -n 1)
result=PASS
if [ -z "$ran" ] || [ -z "$counts" ]; then
  result=FAIL line="no ginkgo summary (csi-sanity exit $rc)"
else
  read -r n total <<<"$ran"
  read -r passed failed pending skipped <<<"$counts"
  line="ran $n of $total, $passed passed, $failed failed, $skipped skipped, $pending pending"
  if [ "$failed" != 0 ] || [ "$rc" != 0 ] || [ "$n" = 0 ]; then result=FAIL; fi
fi
printf 'csi-sanity %-10s %-5s size=%s expand=%s: %s, %s: %s\n' \
  "$label" "$access" "$size" "$expand" "$line" "$wall" "$result"
[ -z "$skip" ] || printf '    skipped on purpose: %s (%s)\n' "$skip" "$why"
if [ "$result" != PASS ]; then
  {
    echo "--- csi-sanity $label $access (exit $rc): failures"
    sed -n '/^Summarizing [0-9]* Failure/,$p' "$out"
    grep -q '^Summarizing' "$out" || tail -n 40 "$out"
    echo "--- localvol (tail)"
    tail -n 20 "$daemon_log"
  } >&2
  exit 1
fi
