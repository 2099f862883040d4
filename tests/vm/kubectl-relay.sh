# shellcheck shell=bash
# tests/vm/kubectl-relay.sh - the guest cluster's kubectl, run on the host (sourced by
# tests/vm/cluster.sh, which serves, and tests/vm/cluster-guest.sh, which asks).
#
# Under TCG a kubectl process costs the guest about 2 s of CPU (a large Go program's
# start and its TLS handshake, emulated), and the harness's polls and checks run
# hundreds. The API server runs on the host (cluster.sh), so the guest's harness hands
# each call to the host instead, through a directory both see (RELAY, in the run's
# shared directory): a request is a directory REQ.req holding `argv` (NUL-separated)
# and, for `-f -`, `stdin`; the host renames it REQ.run, runs kubectl with the control
# plane's admin kubeconfig in the project's directory (the harness names files by
# absolute paths in the project and the kit, which the host sees at the same paths),
# and writes `out`, `err` and, last, `rc`. Output comes back when the call ends: the
# harness never follows a stream.

# The host side: serves RELAY until killed. KUBECONFIG is the control plane's.
relay_serve() { # RELAY KUBECTL
  local relay=$1 kubectl=$2 req
  while :; do
    for req in "$relay"/*.req; do
      [ -d "$req" ] && mv "$req" "${req%.req}.run" 2>/dev/null || continue
      relay_run "${req%.req}.run" "$kubectl" &
    done
    sleep 0.05
  done
}
relay_run() { # DIR KUBECTL
  local dir=$1 argv=() rc=0 in=/dev/null
  mapfile -d '' argv <"$dir/argv"
  [ ! -f "$dir/stdin" ] || in=$dir/stdin
  timeout -k 5 900 "$2" "${argv[@]}" <"$in" >"$dir/out" 2>"$dir/err" || rc=$?
  echo "$rc" >"$dir/rc.new" && mv "$dir/rc.new" "$dir/rc"
}

# The guest side: kubectl, as a function, so that the harness's `k` and its own
# `kubectl` calls take it. Waits up to 960 s for the host (exit 124 then).
relay_client() { # RELAY: from now on, kubectl is relayed to the host
  KUBECTL_RELAY=$1
  # A sleep without a process: read with a timeout on a FIFO nobody writes to.
  mkfifo "/tmp/kubectl-relay.$$" && exec {KUBECTL_RELAY_SLEEP}<>"/tmp/kubectl-relay.$$" &&
    rm "/tmp/kubectl-relay.$$"
}
kubectl() {
  local req a prev="" stdin=0 waited=0 rc
  req=$KUBECTL_RELAY/${EPOCHREALTIME/./}-$BASHPID-$RANDOM
  for a in "$@"; do
    case $prev:$a in -f:-|--filename:-|*:--filename=-|*:-f=-) stdin=1 ;; esac
    prev=$a
  done
  mkdir "$req.new" || return 1
  printf '%s\0' "$@" >"$req.new/argv"
  [ $stdin = 0 ] || cat >"$req.new/stdin"
  mv "$req.new" "$req.req"
  until [ -f "$req.run/rc" ]; do
    read -r -t 0.05 -u "$KUBECTL_RELAY_SLEEP" _ || true   # the callers may run under errexit
    waited=$((waited + 1))
    [ $waited -lt 19200 ] || { echo "kubectl (relayed): no answer from the host in 960 s" >&2; return 124; }
  done
  cat "$req.run/out"; cat "$req.run/err" >&2
  rc=$(cat "$req.run/rc")
  rm -rf "$req.run"
  return "$rc"
}
