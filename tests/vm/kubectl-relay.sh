# shellcheck shell=bash
# tests/vm/kubectl-relay.sh - the guest cluster's kubectl, run on the host (sourced by
# tests/vm/cluster.sh, which serves, and tests/vm/cluster-guest.sh, which asks).
#
# Under TCG every process costs the guest: a kubectl about 1.5 s of CPU (a large Go
# program's start and its TLS handshake, emulated), even a `cat` or `mkdir` about 0.1 s
# (process accounting in the guest, tests/vm/README.md). The API server runs on the host
# (cluster.sh), so the guest's harness hands each call to the host, through a directory
# both see (RELAY, in the run's shared directory), and starts no process to do it: the
# shell's own redirections and reads only. A request REQ is REQ.argv (the arguments,
# NUL-separated), REQ.stdin for `-f -`, then REQ.ready; the host runs kubectl with the
# control plane's admin kubeconfig in the project's directory (the harness names files
# by absolute paths in the project and the kit, which the host sees at the same paths)
# and writes REQ.out, REQ.err and, last, REQ.rc; the guest reads them and writes
# REQ.done, and the host removes the request's files later. Output comes back when the call
# ends: the harness never follows a stream.

# The host side: serves RELAY until killed. KUBECONFIG is the control plane's. A file the
# guest has just made is left alone until the request is done: QEMU's 9p server finds a
# file by its path, and the guest's kernel may still look at it after making it (a
# request file removed at once failed in the guest with "No such file or directory").
# So are the request's files once done, for 10 s. Needs tests/cluster/lib.sh's pause.
relay_serve() { # RELAY KUBECTL
  local relay=$1 kubectl=$2 f req
  local -A taken=() done_at=()
  while :; do
    for f in "$relay"/*.ready; do
      req=${f%.ready}
      [ -f "$f" ] && [ -z "${taken[$req]:-}" ] || continue
      taken[$req]=1
      relay_run "$req" "$kubectl" &
    done
    for f in "$relay"/*.done; do
      req=${f%.done}
      [ -f "$f" ] || continue
      : "${done_at[$req]:=$SECONDS}"
      [ $((SECONDS - done_at[$req])) -ge 10 ] || continue
      rm -f "$req".*
      unset "taken[$req]" "done_at[$req]"
    done
    # lib.sh's pause, not sleep: a process 20 times a second is CPU the guests want.
    pause 0.05
  done
}
relay_run() { # REQ KUBECTL
  local req=$1 argv=() rc=0 in=/dev/null
  mapfile -d '' argv <"$req.argv"
  [ ! -f "$req.stdin" ] || in=$req.stdin
  timeout -k 5 900 "$2" "${argv[@]}" <"$in" >"$req.out" 2>"$req.err" || rc=$?
  echo "$rc" >"$req.rc.new" && mv "$req.rc.new" "$req.rc"
}

# The guest side: kubectl, as a function, so that the harness's `k` and its own
# `kubectl` calls take it. Waits up to 960 s for the host (exit 124 then). Needs
# tests/cluster/lib.sh's pause. Defined by relay_client only: the host, which sources
# this file to serve, keeps its own kubectl.
relay_client() { # RELAY: from now on, kubectl is relayed to the host
  KUBECTL_RELAY=$1
  [ -d "$KUBECTL_RELAY" ] || return 1
  kubectl() { relay_kubectl "$@"; }
}
relay_kubectl() {
  local req a prev="" stdin=0 waited=0 text="" rc=""
  req=$KUBECTL_RELAY/${EPOCHREALTIME/./}-$BASHPID-$RANDOM
  for a in "$@"; do
    case $prev:$a in -f:-|--filename:-|*:--filename=-|*:-f=-) stdin=1 ;; esac
    prev=$a
  done
  if [ $stdin = 1 ]; then
    IFS= read -r -d '' text || true
    printf '%s' "$text" >"$req.stdin"
  fi
  printf '%s\0' "$@" >"$req.argv"
  : >"$req.ready"
  until [ -f "$req.rc" ]; do
    pause 0.05
    waited=$((waited + 1))
    [ $waited -lt 19200 ] || { echo "kubectl (relayed): no answer from the host in 960 s" >&2; return 124; }
  done
  text=""; IFS= read -r -d '' text <"$req.out" || true; printf '%s' "$text"
  text=""; IFS= read -r -d '' text <"$req.err" || true; printf '%s' "$text" >&2
  read -r rc <"$req.rc" || true
  : >"$req.done"
  return "${rc:-1}"
}
