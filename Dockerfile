# syntax=docker/dockerfile:1
#
# localvol node plugin image.
#   docker build -t localvol:dev .        (BuildKit is needed for the cache mounts)

# ---- build ------------------------------------------------------------------
FROM rust:1-bookworm AS builder
WORKDIR /src
COPY . .
# protoc comes from the protoc-bin-vendored crate, so no apt packages are needed.
# The registry, git checkouts and target/ live in BuildKit cache mounts, so a
# rebuild after a source change recompiles only localvol, not its
# dependencies. target/ is a cache mount (absent from the image layer), so the
# binary is copied out in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked \
 && install -D -m 0755 target/release/localvol /out/localvol

# ---- runtime ----------------------------------------------------------------
FROM debian:bookworm-slim
# lvm2 + thin-provisioning-tools: LVM thick/thin classes (lvm.conf points
#   thin_check_executable at /usr/sbin/thin_check; without it thin pools do not
#   activate).
# ndctl: PMEM namespaces.  e2fsprogs, xfsprogs: mkfs/resize2fs/xfs_growfs.
# util-linux, mount: blkid, findmnt, fstrim, losetup, mount.
# cryptsetup-bin: LUKS2 for encrypted StorageClasses.
# ca-certificates: TLS to the API server.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates \
      cryptsetup-bin \
      e2fsprogs \
      lvm2 \
      mount \
      ndctl \
      thin-provisioning-tools \
      util-linux \
      xfsprogs \
 && rm -rf /var/lib/apt/lists/*

# LVM inside a container (the same settings localvol passes to every LVM
# command with --config, so they hold where the pod mounts the host's /etc/lvm
# over this file: components/lvm-host). The pod bind-mounts the host's /dev, but no udev
# daemon runs in the container, and the host's udevd cannot answer libdm's
# completion semaphores, which live in the container's IPC namespace.
#  - udev_sync = 0: do not wait for udev to confirm each device-mapper
#    change (otherwise lvcreate/lvchange block until the udev timeout).
#  - udev_rules = 0: libdm creates /dev/mapper/* and /dev/<vg>/<lv> itself and
#    flags the uevents so that the host's udev rules leave them alone.
#  - monitoring = 0: do not register LVs with dmeventd; LVM would otherwise
#    start dmeventd as a stray daemon inside the pod. Thin-pool auto-extend
#    is thus off; the thin class's overprovision-ratio bounds pool use.
# Debian ships these settings commented out at their defaults; the sed turns
# them on with our values, and lvmconfig proves it (fails the build if the
# file layout ever changes and a setting is not applied).
RUN sed -i -E 's/^([[:space:]]*)#?[[:space:]]*(udev_sync|udev_rules|monitoring) = 1$/\1\2 = 0/' \
      /etc/lvm/lvm.conf \
 && [ "$(lvmconfig activation/udev_sync activation/udev_rules activation/monitoring | tr '\n' ' ')" \
      = "udev_sync=0 udev_rules=0 monitoring=0 " ]

COPY --from=builder /out/localvol /usr/local/bin/localvol
ENTRYPOINT ["/usr/local/bin/localvol"]
CMD ["serve"]
