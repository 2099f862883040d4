# shellcheck shell=bash  # sourced, never run
# tests/sanity/kit.sh - sourced by the csi-sanity steps: `sanity_kit WHAT` installs the
# kube-kit's binaries from $REPO/../shared/kube-kit into /var/cache/kube-kit and exports
# CSI_SANITY. Without the kit it prints "WHAT: NOT RUN" with what to provide and returns 1,
# or exits 1 when CI=true (CI must run csi-sanity).
sanity_kit() {
  local repo kit
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
  kit=$repo/../shared/kube-kit
  if [ ! -x "$kit/install.sh" ]; then
    echo "$1: NOT RUN: no kube-kit at $kit (provide shared/kube-kit beside the repository; it holds csi-sanity-master)"
    if [ "${CI:-}" = true ]; then echo "CI=true: csi-sanity must run" >&2; exit 1; fi
    return 1
  fi
  "$kit/install.sh" /var/cache/kube-kit >/dev/null
  export CSI_SANITY=/var/cache/kube-kit/bin/csi-sanity-master
}
