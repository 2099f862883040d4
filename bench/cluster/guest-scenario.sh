# shellcheck shell=bash  # sourced, never run
# bench/cluster/guest-scenario.sh - pod start per class in the VM guest's cluster, as a
# scenario of tests/vm/cluster.sh (sourced through LOCALVOL_CLUSTER_EXTRA by
# bench/cluster/guest.sh, on the all-classes configuration: loop, lvm, lvm-thin, pmem
# direct and pmem lvm in one deployment).
#
# One pod at a time, each with a new 64Mi ext4 claim of one class, or an emptyDir (the
# floor), interleaved across the kinds with each kind first in turn. Each start is timed
# from the watch of the namespace's pods and claims (stamped as this shell reads them):
# from the pod's first appearance to its phase Running, split at its claim's Bound
# (scheduling and CreateVolume before it; NodeStage, NodePublish and the container
# start after it). Each pod and claim is deleted, and its volume gone, before the next
# start. Writes target/bench/guest-pod-start.{json,md} (ratios: each kind's median
# against the loop class's and the floor's, measured in this run) and prints the table.
EXTRA_SCENARIOS+=(bench_pod_start)
BENCH_KINDS=(floor loop lvm lvm-thin pmem pmem-lvm)

bench_pod_start() {
  local rounds=${LOCALVOL_BENCH_ROUNDS:-5} ns=lvtest-bench round i n=${#BENCH_KINDS[@]}
  local pods=$LOGS/bench-pods.log claims=$LOGS/bench-claims.log samples=$LOGS/bench-samples.txt
  new_namespace $ns
  : >"$samples"
  # One watch per kind of object for the whole run: a line per event, stamped here.
  # Each in a session of its own, so that killing it kills kubectl too.
  setsid bash -c "$BENCH_WATCH" pods $ns >"$pods" &
  local pod_watch=$!
  setsid bash -c "$BENCH_WATCH" pvc $ns >"$claims" &
  local claim_watch=$!
  trap 'kill -- -$pod_watch -$claim_watch 2>/dev/null' EXIT
  sleep 2
  for ((round = 0; round < rounds; round++)); do
    for ((i = 0; i < n; i++)); do
      bench_one_start $ns "${BENCH_KINDS[(i + round) % n]}" "$round" "$pods" "$claims" "$samples"
    done
  done
  kill -- -$pod_watch -$claim_watch 2>/dev/null
  trap - EXIT
  delete_namespace $ns
  mkdir -p "$REPO/target/bench"
  python3 - "$samples" "$REPO/target/bench/guest-pod-start" "$rounds" <<'PY' | while IFS= read -r line; do note "NOTE bench: $line"; done
import json, statistics, sys
samples, out, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
kinds = {}
for line in open(samples):
    kind, total, bound, node = line.split()
    kinds.setdefault(kind, []).append((float(total), float(bound), float(node)))
med = {k: {
    "total_ms": statistics.median(t for t, _, _ in v),
    "to_bound_ms": statistics.median(b for _, b, _ in v),
    "bound_to_running_ms": statistics.median(n for _, _, n in v),
    "samples_ms": [t for t, _, _ in v]} for k, v in kinds.items()}
loop, floor = med["loop"]["total_ms"], med["floor"]["total_ms"]
for k, m in med.items():
    m["vs_loop"] = m["total_ms"] / loop
    m["vs_floor"] = m["total_ms"] / floor
json.dump({"rounds": rounds, "kinds": med}, open(out + ".json", "w"), indent=2)
rows = ["| kind | pod start / loop's | pod start / emptyDir's | to claim Bound / total | target (<= 1.2x loop) |",
        "|---|---|---|---|---|"]
for k in ["floor", "loop", "lvm", "lvm-thin", "pmem", "pmem-lvm"]:
    m = med[k]
    share = "-" if k == "floor" else f"{m['to_bound_ms'] / m['total_ms']:.2f}"
    target = "-" if k in ("floor", "loop") else ("met" if m["vs_loop"] <= 1.2 else "missed")
    rows.append(f"| {k} | {m['vs_loop']:.2f} | {m['vs_floor']:.2f} | {share} | {target} |")
text = "\n".join(rows)
open(out + ".md", "w").write(
    f"Pod start with a new volume per class in the VM guest's cluster: medians of {rounds} "
    "starts each, interleaved, as ratios measured in one run (bench/cluster/guest.sh).\n\n" + text + "\n")
print(text)
PY
}

# The events of objects of kind $0 in namespace $1, one line each: "SECONDS NAME PHASE".
BENCH_WATCH='kubectl -n "$1" get "$0" --watch -o jsonpath="{.metadata.name} {.status.phase}{\"\n\"}" 2>/dev/null |
  while read -r name phase; do echo "$EPOCHREALTIME $name $phase"; done'

# The first time WATCH-LOG showed NAME (in PHASE, if given).
bench_seen() { # WATCH-LOG NAME [PHASE]
  awk -v n="$2" -v p="${3:-}" '$2 == n && (p == "" || $3 == p) {print $1; exit}' "$1"
}
bench_is_running() { [ -n "$(bench_seen "$1" "$2" Running)" ]; }

# One start of KIND: appends "KIND TOTAL-MS TO-BOUND-MS BOUND-TO-RUNNING-MS" to SAMPLES.
bench_one_start() { # NAMESPACE KIND ROUND POD-LOG CLAIM-LOG SAMPLES
  local ns=$1 kind=$2 pod=start-$2-$3 claim=claim-$2-$3
  # A claim waits for its pod (WaitForFirstConsumer): the pod's appearance starts it.
  if [ "$kind" = floor ]; then
    apply_pod "$ns" "$pod" emptydir "" >/dev/null
  else
    apply_pvc "$ns" "$claim" 64Mi "localvol-all-$kind" >/dev/null
    apply_pod "$ns" "$pod" fs "$claim" >/dev/null
  fi
  wait_until 300 "pod $pod Running" bench_is_running "$4" "$pod"
  local seen running bound pv=""
  seen=$(bench_seen "$4" "$pod") running=$(bench_seen "$4" "$pod" Running)
  bound=$running
  if [ "$kind" != floor ]; then
    bound=$(bench_seen "$5" "$claim" Bound)
    [ -n "$bound" ] || fail "claim $claim not seen Bound while its pod runs"
    pv=$(pv_of "$ns" "$claim")
  fi
  k -n "$ns" delete pod "$pod" --wait=true >/dev/null
  if [ -n "$pv" ]; then
    k -n "$ns" delete pvc "$claim" --wait=true >/dev/null
    wait_until 120 "volume $pv deleted" gone pv "$pv"
  fi
  python3 -c 'import sys; s, b, r = map(float, sys.argv[2:]); print(sys.argv[1], round((r - s) * 1000), round((b - s) * 1000), round((r - b) * 1000))' \
    "$kind" "$seen" "$bound" "$running" >>"$6"
}
