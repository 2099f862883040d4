#!/usr/bin/env bash
# bench/crowded-host.sh up|down (root): makes this host look like a busy node for the
# CSI-level benchmark: 130 more attached loop devices (16 MiB sparse files) and 600
# more mounts (1 MiB tmpfs), under /tmp/localvol-crowd; `down` removes all of it.
#   bench/crowded-host.sh up && cargo bench --bench lifecycle -- --quick; bench/crowded-host.sh down
# The raw tools' times do not change with them; localvol's node calls, which read the
# mount table and the loop device list, do.
set -euo pipefail
dir=/tmp/localvol-crowd
case ${1:-} in
  up)
    mkdir -p "$dir/images" "$dir/mounts"
    for i in $(seq 1 130); do
      truncate -s 16M "$dir/images/f$i.img"
      losetup --find "$dir/images/f$i.img"
    done
    for i in $(seq 1 600); do
      mkdir -p "$dir/mounts/m$i"
      mount -t tmpfs -o size=1M "crowd$i" "$dir/mounts/m$i"
    done
    ;;
  down)
    for m in "$dir"/mounts/m*; do [ -d "$m" ] && { umount "$m" 2>/dev/null || true; }; done
    for f in "$dir"/images/*.img; do
      [ -e "$f" ] || continue
      for device in $(losetup --associated "$f" | cut -d: -f1); do losetup --detach "$device"; done
    done
    rm -rf "$dir"
    ;;
  *) echo "usage: bench/crowded-host.sh up|down" >&2; exit 2 ;;
esac
