#!/usr/bin/env bash
# tests/image/runtime-stage.sh - runs the Dockerfile's runtime stage without a
# container engine (none on the CI machines, and no image registry either): a
# Debian bookworm minbase root filesystem from the apt mirror (what
# debian:bookworm-slim is built from), then every RUN instruction of the
# Dockerfile's last stage in a chroot of it, as written there, then the COPY of
# the binary (a debug build links the same system libraries as the builder stage's
# release build) and the ENTRYPOINT with --version and `serve --help`. The binary is
# built here with `cargo build --locked`, or it is LOCALVOL_IMAGE_BINARY, taken once
# the file LOCALVOL_IMAGE_BINARY_READY exists (tests/all.sh: its test build's binary,
# once that build is done; `cargo build` resolves features without the
# dev-dependencies' and compiled most of the dependency graph a second time, over
# three minutes that held the target directory's lock in a CI rehearsal).
#
# What this proves: the runtime packages install, the lvm.conf edit applies
# (the RUN's own lvmconfig check), and the binary runs on that image's
# libraries. What it does not: BuildKit's cache mounts and the layer build.
#
#   tests/image/runtime-stage.sh [ROOTFS_CACHE_DIR]   (root; needs the apt mirror)
#   tests/image/runtime-stage.sh --export-path [ROOTFS_CACHE_DIR]
#
# LOCALVOL_IMAGE_EXPORT=FILE.tar also writes the finished root filesystem, without the
# binary, as a tar (tests/cluster makes the node's image from it with the binary added).
# --export-path prints the FILE.tar under the cache that tests/cluster looks for: the
# root filesystem depends only on the Dockerfile and on this script.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ "${1:-}" = --export-path ]; then
  echo "${2:-/var/cache/localvol-image}/runtime-$(cat Dockerfile tests/image/runtime-stage.sh | sha256sum | cut -c1-16).tar"
  exit 0
fi
cache=${1:-/var/cache/localvol-image}
command -v mmdebstrap >/dev/null || apt-get install -y -qq mmdebstrap >/dev/null

base=$cache/bookworm-minbase.tar
mkdir -p "$cache"
if [ ! -s "$base" ]; then
  echo "runtime-stage: building a bookworm minbase root filesystem"
  mmdebstrap --quiet --variant=minbase --format=tar bookworm "$base.tmp"
  mv "$base.tmp" "$base"
fi
root=$(mktemp -d /tmp/localvol-image.XXXXXX)
cleanup() {
  for m in proc sys dev; do umount -l "$root/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$root"
}
trap cleanup EXIT
tar -C "$root" -xf "$base"
cp /etc/resolv.conf "$root/etc/resolv.conf"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
mount --rbind /dev "$root/dev"

# The last stage: from its FROM line to the end, continuation lines joined.
stage=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' Dockerfile |
        sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -v '^[[:space:]]*#')
grep -q '^FROM debian:bookworm-slim' <<<"$stage" ||
  { echo "runtime-stage: the last stage is not FROM debian:bookworm-slim" >&2; exit 1; }

runs=0
while IFS= read -r line; do
  case $line in
    RUN\ *)
      echo "runtime-stage: RUN ${line:4:100}..."
      chroot "$root" /bin/sh -c "${line#RUN }"
      runs=$((runs + 1)) ;;
    COPY\ --from=builder\ /out/localvol\ *)
      dest=${line##* }
      binary=${LOCALVOL_IMAGE_BINARY:-}
      if [ -n "$binary" ]; then
        [ -z "${LOCALVOL_IMAGE_BINARY_READY:-}" ] ||
          until [ -e "$LOCALVOL_IMAGE_BINARY_READY" ]; do sleep 1; done
      else
        cargo build --locked --bin localvol
        binary=${CARGO_TARGET_DIR:-target}/debug/localvol
      fi
      install -D -m 0755 "$binary" "$root$dest"
      entry=$dest ;;
    COPY\ *) echo "runtime-stage: unknown COPY: $line" >&2; exit 1 ;;
  esac
done <<<"$stage"
[ "$runs" -ge 2 ] || { echo "runtime-stage: expected the apt and lvm.conf RUNs, ran $runs" >&2; exit 1; }
chroot "$root" "$entry" --version
chroot "$root" "$entry" serve --help >/dev/null
for tool in lvcreate thin_check ndctl mkfs.ext4 mkfs.xfs blkid losetup fstrim mount cryptsetup; do
  chroot "$root" /bin/sh -c "command -v $tool" >/dev/null ||
    { echo "runtime-stage: $tool is missing from the image" >&2; exit 1; }
done
if [ -n "${LOCALVOL_IMAGE_EXPORT:-}" ]; then
  # proc, sys and dev are mounts: --one-file-system leaves their contents out.
  # Left out as the real base image never has them: debian:bookworm-slim deletes the
  # downloaded .debs after each install (apt's docker-clean hook) and never installs
  # documentation, manual pages or translations (dpkg path excludes); minbase keeps all
  # of them (about 150 MB of 380).
  rm -f "$root/etc/resolv.conf"
  tar --one-file-system -C "$root" --exclude="./${entry#/}" \
    --exclude='./var/cache/apt/archives/*.deb' --exclude='./var/cache/apt/*.bin' \
    --exclude='./usr/share/doc/*' --exclude='./usr/share/man/*' --exclude='./usr/share/info/*' \
    --exclude='./usr/share/locale/*' \
    -cf "$LOCALVOL_IMAGE_EXPORT.tmp" .
  mv "$LOCALVOL_IMAGE_EXPORT.tmp" "$LOCALVOL_IMAGE_EXPORT"
  echo "runtime-stage: root filesystem written to $LOCALVOL_IMAGE_EXPORT"
fi
echo "runtime-stage: PASS ($runs RUN instructions, entrypoint $entry runs)"
