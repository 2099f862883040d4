#!/usr/bin/env bash
# shellcheck disable=SC2054  # the commas inside QEMU arguments are intended
# tests/vm/run.sh - run one command as root in a throw-away QEMU guest that has
# what localvol's backends need and the host may lack: device-mapper (LVM thick
# and thin) and an emulated NVDIMM (ndctl fsdax namespaces). See README.md.
#
#   tests/vm/run.sh [options] -- COMMAND [ARGS...]
#
#   --pmem-size SIZE  NVDIMM size, a multiple of 16M (default 1G; 0 = no NVDIMM)
#   --disk-size SIZE  size of each scratch disk (default 4G)
#   --disks N         number of scratch disks /dev/vda, /dev/vdb, ... (default 1)
#   --mem SIZE        guest RAM (default 1G)
#   --timeout SECS    stop the guest after SECS and exit 124 (default 3600)
#   A boot that has not started COMMAND after LOCALVOL_VM_BOOT_TIMEOUT seconds (300)
#   is killed and booted again, LOCALVOL_VM_BOOT_TRIES times in all (3).
#   LOCALVOL_VM_TB_SIZE: TCG's translated-code cache in MiB (default 256), emptied whole
#   when full; a guest that runs many large programs (a Kubernetes node:
#   tests/vm/cluster.sh) wants more.
#   --share DIR       share DIR read-write at the same path (repeatable)
#   --attach FILE     FILE as one more disk after the scratch disks (written in place)
#   --tap IFNAME      a virtio NIC on the host's tap device IFNAME (made and addressed
#                     by the caller; the guest loads virtio_net and addresses it)
#   -v                progress and the live guest console on stderr
#
# The guest's / is the host's / (read-only, tmpfs overlay). The project, the
# current directory, $CARGO_TARGET_DIR and --share dirs are shared read-write
# at the same paths. COMMAND runs in the current directory with the caller's
# environment plus VMTEST_GUEST=1 and DM_DISABLE_UDEV=1, stdin /dev/null, and the
# system's bin and sbin directories first in PATH.
# Exit status: COMMAND's; 124 on timeout; 125 if the guest could not be
# booted, panicked or died (the console tail is printed).
set -euo pipefail

CACHE=/var/cache/localvol-vm
PKGS=(qemu-system-x86 busybox-static lvm2 thin-provisioning-tools ndctl xfsprogs e2fsprogs cryptsetup-bin
      cpio kmod util-linux xz-utils coreutils binutils)
# Loaded at boot: there is no udev in the guest to load drivers on demand.
MODULES="virtio_pci virtio_blk virtio_console virtio_rng 9pnet_virtio 9p overlay loop
         dm_mod dm_thin_pool dm_crypt xts algif_skcipher nfit nd_pmem"

PMEM_SIZE=1G DISK_SIZE=4G DISKS=1 MEM=1G TIMEOUT=3600 VERBOSE=0 SHARES=() ATTACH=() TAP=
T0=${EPOCHREALTIME/./}
log() {
  [ "$VERBOSE" = 1 ] || return 0
  local t=$(( (${EPOCHREALTIME/./} - T0) / 10000 ))
  printf 'run.sh [%3d.%02ds] %s\n' $((t / 100)) $((t % 100)) "$*" >&2
}
die() { echo "tests/vm/run.sh: ERROR: $*" >&2; exit 125; }
usage() { sed -n '7,22s/^# \{0,1\}//p' "$0" >&2; exit 125; }
bytes() { numfmt --from=iec "${1%[bB]}" 2>/dev/null || die "bad size: $1"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --pmem-size) PMEM_SIZE=$2; shift 2 ;;
    --disk-size) DISK_SIZE=$2; shift 2 ;;
    --disks) DISKS=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --share) SHARES+=("$2"); shift 2 ;;
    --tap) TAP=$2; shift 2 ;;
    --attach) ATTACH+=("$2"); shift 2 ;;
    -v) VERBOSE=1; shift ;;
    --) shift; break ;;
    *) echo "tests/vm/run.sh: unknown option '$1'" >&2; usage ;;
  esac
done
[ $# -gt 0 ] || usage
[ "$(id -u)" = 0 ] || die "must run as root (apt-get, 9p passthrough)"
[[ "$DISKS" =~ ^[0-9]+$ && "$DISKS" -le 26 ]] || die "--disks must be 0..26"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout must be a number of seconds"

# ---------------------------------------------------------------- host setup
# Everything under the lock: parallel runs share apt and the cache.
mkdir -p "$CACHE"
exec 9>"$CACHE/lock"
flock 9

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      "${missing[@]}"; } >"$CACHE/apt.log" 2>&1 \
    || { tail -n 20 "$CACHE/apt.log" >&2; die "apt-get install ${missing[*]} failed (log: $CACHE/apt.log)"; }
fi

# Guest kernel: Debian's stock one (the package linux-image-amd64 points to),
# downloaded once, never installed. Pinned by the cache from then on.
KDIR=$(find "$CACHE" -maxdepth 2 -name .complete -path '*/kernel-*' -printf '%h\n' | sort -V | tail -n 1)
if [ -z "$KDIR" ]; then
  kpkg() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
  pkg=$(kpkg)
  [ -n "$pkg" ] || { apt-get update >"$CACHE/apt.log" 2>&1; pkg=$(kpkg); }
  [ -n "$pkg" ] || die "cannot resolve linux-image-amd64 to a kernel package (log: $CACHE/apt.log)"
  log "downloading guest kernel $pkg (once)"
  tmp=$(mktemp -d "$CACHE/tmp.XXXXXX")
  ( cd "$tmp" && apt-get download "$pkg" ) >"$CACHE/apt.log" 2>&1 \
    || { rm -rf "$tmp"; die "apt-get download $pkg failed (log: $CACHE/apt.log)"; }
  mkdir "$tmp/root"
  m='./lib/modules/*'   # only the module trees a storage test can need
  dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp/root" --wildcards \
    './boot/vmlinuz-*' './boot/config-*' "$m/modules.*" "$m/kernel/fs" "$m/kernel/lib" \
    "$m/kernel/crypto" "$m/kernel/arch" "$m/kernel/block" "$m/kernel/net/9p" \
    "$m/kernel/drivers/"{md,nvdimm,dax,acpi,block,virtio,char,scsi} \
    || { rm -rf "$tmp"; die "cannot unpack $pkg"; }
  kver=$(ls "$tmp/root/lib/modules")
  depmod -b "$tmp/root" "$kver" || { rm -rf "$tmp"; die "depmod failed"; }
  # QEMU can boot the uncompressed ELF vmlinux through its PVH entry point,
  # which skips the real-mode setup and decompression (~2 s under TCG).
  vmlinuz=$tmp/root/boot/vmlinuz-$kver
  off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1)
  if [ -n "$off" ] && grep -qx 'CONFIG_PVH=y' "$tmp/root/boot/config-$kver"; then
    tail -c +$((off + 1)) "$vmlinuz" | xz -dc >"$tmp/root/boot/vmlinux" 2>/dev/null || true
    [ "$(head -c 4 "$tmp/root/boot/vmlinux")" = $'\x7fELF' ] || rm -f "$tmp/root/boot/vmlinux"
  fi
  KDIR=$CACHE/kernel-$kver
  rm -rf "$KDIR" && mv "$tmp/root" "$KDIR" && rm -rf "$tmp" && touch "$KDIR/.complete"
fi
KVER=$(ls "$KDIR/lib/modules")
MODDIR=$KDIR/lib/modules/$KVER
KERNEL=$KDIR/boot/vmlinux
[ -f "$KERNEL" ] || KERNEL=$KDIR/boot/vmlinuz-$KVER

# Stage 1, PID 1 in the initramfs (busybox): load the modules, build the root
# (host / over 9p, read-only, tmpfs overlay), mount the shares, wait for the
# devices, patch lvm.conf, then hand over to stage 2 run by the host's bash.
# Any failure powers off before COMMAND runs, so the host sees no exit status.
read -r -d '' INIT <<'EOF' || true
#!/bin/busybox sh
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev
fatal() { echo "localvol-vm: FATAL: $*"; poweroff -f; sleep 60; }
. /etc/kver
for ko in $(cat /mods/order); do insmod "/mods/$ko" || fatal "insmod $ko failed"; done
hostname localvol-vm; ip link set lo up
O=trans=virtio,version=9p2000.L,msize=512000
R=/newroot
mkdir -p /vm /lower /rw $R
mount -t 9p -o $O,cache=none vm /vm || fatal "cannot mount the run share"
mount -t 9p -o $O,ro,cache=loose hostroot /lower || fatal "cannot mount the host root"
mount -t tmpfs -o mode=0755 rw /rw && mkdir /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay $R \
  || fatal "cannot mount the overlay root"
for d in proc sys dev; do mount --move /$d $R/$d; done
mount -t tmpfs -o mode=0755,nosuid,nodev tmpfs $R/run
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/tmp
mkdir -p $R/dev/pts $R/dev/shm $R/dev/virtio-ports $R/run/vm $R/run/lock/lvm $R/run/lvm
mount -t devpts -o gid=5,mode=620,ptmxmode=000 devpts $R/dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs $R/dev/shm
ln -s /proc/self/fd $R/dev/fd; ln -s fd/0 $R/dev/stdin; ln -s fd/1 $R/dev/stdout; ln -s fd/2 $R/dev/stderr
mount --move /vm $R/run/vm
while read -r tag dir; do
  mkdir -p "$R$dir" && mount -t 9p -o $O,cache=mmap "$tag" "$R$dir" || fatal "cannot mount share $dir"
done < $R/run/vm/shares
mkdir -p $R/lib/modules/$KVER && mount --bind /lower$MODDIR $R/lib/modules/$KVER
for p in $R/sys/class/virtio-ports/*; do
  ln -s ../${p##*/} $R/dev/virtio-ports/$(cat $p/name)
done
[ -c $R/dev/virtio-ports/stdout ] && [ -c $R/dev/virtio-ports/stderr ] || fatal "no stdout/stderr ports"
# No udev in the guest: LVM and libdm must create /dev nodes themselves.
sed -i 's/^activation {/&\n\tudev_sync = 0\n\tudev_rules = 0/' $R/etc/lvm/lvm.conf
grep -q 'udev_rules = 0' $R/etc/lvm/lvm.conf || fatal "cannot patch /etc/lvm/lvm.conf"
for d in $(cat $R/run/vm/waitfor); do
  i=0; while [ ! -e "$R$d" ]; do
    [ $i -lt 200 ] || fatal "$d did not appear"; usleep 100000; i=$((i + 1))
  done
done
exec switch_root $R /bin/bash /run/vm/stage2.sh
EOF
KCONF="KVER=$KVER
MODDIR=$MODDIR"
ihash=$({ echo "$KVER"; cat "${BASH_SOURCE[0]}" /bin/busybox; } | md5sum | cut -c1-12)
INITRD=$CACHE/initramfs-$ihash.cpio
if [ ! -f "$INITRD" ]; then
  log "building $INITRD"
  ldd /bin/busybox >/dev/null 2>&1 && die "/bin/busybox is not static (need busybox-static)"
  ird=$(mktemp -d "$CACHE/tmp.XXXXXX")
  mkdir -p "$ird"/{bin,proc,sys,dev,etc,mods}
  cp /bin/busybox "$ird/bin/"
  for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$ird/bin/$a"; done
  printf '%s\n' "$INIT" >"$ird/init" && chmod 755 "$ird/init"
  printf '%s\n' "$KCONF" >"$ird/etc/kver"
  # shellcheck disable=SC2086
  modprobe -a -C /dev/null --ignore-install -d "$KDIR" -S "$KVER" --show-depends $MODULES >"$ird/deps" || die "modprobe: modules missing from $KDIR"
  # objcopy drops the appended signatures: checking them costs ~0.5 s per boot under TCG.
  awk '$1 == "insmod" && !seen[$2]++ {print $2}' "$ird/deps" | while read -r ko; do
    objcopy "$ko" "$ird/mods/${ko##*/}" && echo "${ko##*/}" >>"$ird/mods/order"; done
  rm "$ird/deps"
  (cd "$ird" && find . | cpio -o -H newc --quiet) >"$INITRD.tmp" && mv "$INITRD.tmp" "$INITRD"
  rm -rf "$ird"
  find "$CACHE" -maxdepth 1 -name 'initramfs-*.cpio' -mtime +1 -delete   # older versions
fi
flock -u 9

# ---------------------------------------------------------------- this run
# Run dirs of runs that were SIGKILLed are removed by the next run.
for pidfile in /var/tmp/localvol-vm.*/pid; do
  [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null && rm -rf "${pidfile%/pid}"
done
RUN=$(mktemp -d /var/tmp/localvol-vm.XXXXXX)
echo $$ >"$RUN/pid"
QPID='' PIDS=()
# shellcheck disable=SC2317  # called through the trap
cleanup() {
  set +e
  [ -n "$QPID" ] && kill "$QPID" 2>/dev/null
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir "$RUN/vm"

# Shares: read-write at the same path; a dir inside another share is skipped.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
PROJECT=$(git -C "$HERE" rev-parse --show-toplevel 2>/dev/null) || PROJECT=$(cd "$HERE/../.." && pwd -P)
CWD=$(pwd -P)
cands=("$PROJECT" "$CWD")
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  mkdir -p "$CARGO_TARGET_DIR" && cands+=("$(realpath "$CARGO_TARGET_DIR")")
fi
for s in "${SHARES[@]}"; do
  [ -d "$s" ] || die "--share $s: not a directory"; cands+=("$(realpath "$s")")
done
FS_ARGS=(-fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap
         -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot
         -fsdev "local,id=vm,path=$RUN/vm,security_model=none"
         -device virtio-9p-pci,fsdev=vm,mount_tag=vm)
shares=()
mapfile -t cands < <(printf '%s\n' "${cands[@]}" | sort -u)   # parents first
for s in "${cands[@]}"; do
  [ "$s" = / ] && continue
  for k in "${shares[@]}"; do [[ "$s/" == "$k"/* ]] && continue 2; done
  [[ "$s" =~ [,[:space:]] ]] && die "cannot share a path with ',' or whitespace: $s"
  FS_ARGS+=(-fsdev "local,id=share${#shares[@]},path=$s,security_model=none,multidevs=remap"
            -device "virtio-9p-pci,fsdev=share${#shares[@]},mount_tag=share${#shares[@]}")
  echo "share${#shares[@]} $s" >>"$RUN/vm/shares"
  shares+=("$s")
done
touch "$RUN/vm/shares"

# Devices: sparse files. QEMU keeps the NVDIMM label area (128K, room for
# namespace labels) at the end of the backing file, so add it on top: region0
# is then exactly --pmem-size.
DEV_ARGS=() waitfor='' LETTERS=abcdefghijklmnopqrstuvwxyz disk_files=()
for ((d = 0; d < DISKS; d++)); do
  truncate -s "$(bytes "$DISK_SIZE")" "$RUN/disk$d.img"
  disk_files+=("$RUN/disk$d.img")
done
for f in "${ATTACH[@]}"; do
  [ -f "$f" ] && [[ ! "$f" =~ [,[:space:]] ]] || die "--attach $f: not a file, or a path with ',' or whitespace"
  disk_files+=("$f")
done
[ ${#disk_files[@]} -le 26 ] || die "more than 26 disks"
for d in "${!disk_files[@]}"; do
  DEV_ARGS+=(-drive "file=${disk_files[d]},if=none,id=disk$d,format=raw,discard=unmap,cache=unsafe"
             -device "virtio-blk-pci,drive=disk$d,serial=localvol-disk$d")
  waitfor+=" /dev/vd${LETTERS:d:1}"
done
mem_mib=$(( $(bytes "$MEM") / 1048576 ))
pmem=$(bytes "$PMEM_SIZE")
[ $((pmem % 16777216)) = 0 ] || die "--pmem-size must be a multiple of 16M (the region alignment)"
if [ "$pmem" -gt 0 ]; then
  truncate -s $((pmem + 131072)) "$RUN/pmem0.img"
  DEV_ARGS+=(-machine pc,nvdimm=on -m "${mem_mib}M,slots=1,maxmem=$((mem_mib + pmem / 1048576 + 1))M"
    -object "memory-backend-file,id=pmem0,share=on,mem-path=$RUN/pmem0.img,size=$((pmem + 131072))"
    -device nvdimm,id=nvdimm0,memdev=pmem0,label-size=128K)
  waitfor+=' /sys/bus/nd/devices/region0'
else
  DEV_ARGS+=(-machine pc -m "${mem_mib}M")
fi
echo "$waitfor" >"$RUN/vm/waitfor"
if [ -n "$TAP" ]; then
  [ -e "/sys/class/net/$TAP/tun_flags" ] || die "--tap $TAP: no such tap device"
  DEV_ARGS+=(-netdev "tap,id=net0,ifname=$TAP,script=no,downscript=no" -device virtio-net-pci,netdev=net0)
fi

# Stage 2, PID 1 after switch_root (the host's bash): run COMMAND, record its
# exit status in the run share, power off.
{
  export -p | grep -vE '^declare -x (PWD|OLDPWD|SHLVL|_|HOSTNAME|TERM)(=|$)'
  printf 'export VM_CWD=%q VM_CMD=%q\n' "$CWD" "$(printf '%q ' "$@")"
} >"$RUN/vm/env"
cat >"$RUN/vm/stage2.sh" <<'EOF'
. /run/vm/env
export VMTEST_GUEST=1 DM_DISABLE_UDEV=1 LVM_SUPPRESS_FD_WARNINGS=1
# The Debian tools first: the caller's PATH may begin with a version manager's shims
# (pyenv's python3 is a bash script that runs several more: 3 to 10 s a call here,
# against 0.3 s for /usr/bin/python3, and the cluster harness calls python3 in polls).
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH:/usr/local/sbin:/usr/local/bin"
[ -d "${TMPDIR:-/}" ] || unset TMPDIR
cd "$VM_CWD" || { echo "localvol-vm: FATAL: cannot cd to $VM_CWD"; /bin/busybox poweroff -f; }
read -r up _ </proc/uptime; echo "localvol-vm: command starts at ${up}s"
: >/run/vm/started   # the host's boot watchdog stops here
cmd=$VM_CMD; unset VM_CMD VM_CWD
eval "$cmd" </dev/null >/dev/virtio-ports/stdout 2>/dev/virtio-ports/stderr
rc=$?
echo "$rc" >/run/vm/rc
read -r up _ </proc/uptime; echo "localvol-vm: command exited with $rc at ${up}s"
sync
/bin/busybox poweroff -f
EOF

mkfifo "$RUN/out" "$RUN/err"
: >"$RUN/console.log"
if [ "$VERBOSE" = 1 ]; then
  tail --pid=$$ -n +1 -f "$RUN/console.log" | while IFS= read -r l; do log "console: $l"; done &
  PIDS+=($!)
fi

# Accelerator: KVM only if the CPU shows vmx/svm (a PVM-style /dev/kvm cannot
# run a stock kernel: it hangs), else TCG. LOCALVOL_VM_ACCEL=kvm|tcg overrides.
ACCEL=${LOCALVOL_VM_ACCEL:-}
if [ -z "$ACCEL" ]; then
  ACCEL=tcg; [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && ACCEL=kvm
fi
# One vCPU under TCG: the test suite runs two guests on two cores, and a guest with two
# vCPUs then loses its time to them waiting for each other (a spinlock whose holder's
# thread is off the host CPU, TCG's all-vCPU flushes). Two guests side by side running
# tests/crash_vm.rs, same seed: 181 s and 186 s with two vCPUs each, 92 s and 93 s with
# one (tests/vm/README.md, Cost).
case "$ACCEL" in
  kvm) ACCEL_ARGS=(-accel kvm -cpu host); VCPUS=$(( $(nproc) < 4 ? $(nproc) : 4 )) ;;
  tcg) ACCEL_ARGS=(-accel "tcg,thread=multi,tb-size=${LOCALVOL_VM_TB_SIZE:-256}" -cpu max,la57=off); VCPUS=1 ;;
  *) die "LOCALVOL_VM_ACCEL must be kvm or tcg" ;;
esac
APPEND="console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init"
# Faster boot under TCG: no page zeroing, mitigations, LSM or audit.
APPEND+=" mitigations=off init_on_alloc=0 apparmor=0 audit=0 tsc=reliable no_timer_check"
APPEND+=" acpi=noirq i8042.noaux i8042.nokbd i8042.nopnp 8250.nr_uarts=1 random.trust_cpu=on"
APPEND+=" ${LOCALVOL_VM_APPEND:-}"   # e.g. loglevel=7 to debug the boot
QEMU=(qemu-system-x86_64 -nodefaults -no-user-config -display none -no-reboot
  "${ACCEL_ARGS[@]}" -smp "$VCPUS" -kernel "$KERNEL" -initrd "$INITRD" -append "$APPEND"
  -chardev "file,id=con,path=$RUN/console.log" -serial chardev:con
  -device virtio-serial-pci
  -chardev "file,id=out,path=$RUN/out" -device virtserialport,chardev=out,name=stdout
  -chardev "file,id=err,path=$RUN/err" -device virtserialport,chardev=err,name=stderr
  -device virtio-rng-pci "${FS_ARGS[@]}" "${DEV_ARGS[@]}")
# A boot that has not reached COMMAND after BOOT_TIMEOUT seconds is stuck: under TCG
# with two vCPUs a guest was once seen to hang in early boot, printing nothing, until
# --timeout (an hour). COMMAND has not started then, so booting again is safe.
BOOT_TIMEOUT=${LOCALVOL_VM_BOOT_TIMEOUT:-300}
BOOT_TRIES=${LOCALVOL_VM_BOOT_TRIES:-3}
boot() {  # one boot; sets qrc (124: --timeout; 200: stuck before COMMAND)
  # The guest's stdout/stderr ports write into fifos that we copy to ours.
  cat "$RUN/out" & local out=$!
  cat "$RUN/err" >&2 & local err=$!
  PIDS+=("$out" "$err")
  log "booting $KVER ($ACCEL), shares: ${shares[*]}"
  # pdeathsig: QEMU dies with us, even if we are SIGKILLed.
  setpriv --pdeathsig TERM timeout -k 5 "$TIMEOUT" setpriv --pdeathsig KILL "${QEMU[@]}" \
    </dev/null >>"$RUN/qemu.log" 2>&1 &
  QPID=$!
  local waited=0 stuck=0
  while kill -0 "$QPID" 2>/dev/null && [ ! -e "$RUN/vm/started" ]; do
    if [ "$waited" -ge "$BOOT_TIMEOUT" ]; then stuck=1; kill "$QPID"; break; fi
    sleep 1; waited=$((waited + 1))
  done
  qrc=0; wait "$QPID" || qrc=$?
  QPID=''
  [ "$stuck" = 1 ] && qrc=200
  # If QEMU never opened the fifos, their readers still wait: open and close
  # them once, then let the readers drain.
  exec 7<>"$RUN/out" 8<>"$RUN/err"; exec 7>&- 8>&-
  wait "$out" "$err" 2>/dev/null || true
}
for try in $(seq "$BOOT_TRIES"); do
  boot
  [ "$qrc" = 200 ] || break
  echo "tests/vm/run.sh: the guest did not reach COMMAND within ${BOOT_TIMEOUT}s (boot $try of $BOOT_TRIES); console:" >&2
  tail -n 5 "$RUN/console.log" >&2
  : >"$RUN/console.log"
done
log "qemu exited with $qrc"
[ -f "$RUN/vm/rc" ] && exit "$(cat "$RUN/vm/rc")"
[ "$qrc" = 124 ] && { echo "tests/vm/run.sh: ERROR: timed out after ${TIMEOUT}s" >&2; exit 124; }
[ "$qrc" = 200 ] && echo "tests/vm/run.sh: ERROR: no boot of $BOOT_TRIES reached COMMAND within ${BOOT_TIMEOUT}s" >&2
{
  echo "tests/vm/run.sh: ERROR: the guest did not run the command to completion (qemu exit $qrc)."
  grep -h -e 'localvol-vm: FATAL' -e 'Kernel panic' "$RUN/console.log" || true
  echo "--- guest console (tail):"; tail -n 30 "$RUN/console.log"
  [ -s "$RUN/qemu.log" ] && { echo "--- qemu:"; tail -n 10 "$RUN/qemu.log"; }
} >&2
exit 125
