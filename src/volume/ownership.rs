//! Proof, from the mount table, that a path holds this volume before anything touches it.
//!
//! A node call names a volume and a path; nothing but the mount table says whether what
//! is mounted at that path is that volume. A filesystem volume shows as a mount of its
//! device's filesystem root (the staging mount, and each bind of it at a target); a raw
//! block volume's target is a bind of its device node, which shows as devtmpfs with the
//! node's name as the mount's root.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::placed::Role;
use super::targets::nothing_below;
use super::{VolumeError, Volumes, check_no_symlinks, io_error};
use crate::backend::Backend;
use crate::host::MountedAt;
use crate::model::{Token, VolumeId};
use crate::mount::{MountEntry, MountTable};
use crate::request::HostPath;

/// How this volume appears in the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    /// The device number of the volume's block device.
    pub dev: u64,
    /// The device node's path below devtmpfs, as a bind of it shows.
    pub devtmpfs_root: PathBuf,
}

/// What a path holds.
#[derive(Debug)]
pub(super) enum Holding<'a> {
    Nothing,
    This(&'a MountEntry),
    Other(&'a MountEntry),
}

impl Identity {
    /// A mount of the volume's filesystem root: its staging mount or a bind of it.
    pub fn is_filesystem(&self, entry: &MountEntry) -> bool {
        self.is_filesystem_root(entry.device_number(), &entry.root)
    }

    /// A bind of the volume's device node (a raw block target).
    pub fn is_device_bind(&self, entry: &MountEntry) -> bool {
        self.is_device_node(&entry.fs_type, &entry.root)
    }

    /// The same two tests on a mount as statmount(2) shows it.
    pub fn is_shown_by(&self, mount: &MountedAt) -> bool {
        self.is_filesystem_shown_by(mount) || self.is_device_node(&mount.fs_type, &mount.root)
    }

    /// [`is_filesystem`](Self::is_filesystem) on a mount as statmount(2) shows it.
    pub fn is_filesystem_shown_by(&self, mount: &MountedAt) -> bool {
        let dev = nix::sys::stat::makedev(mount.major.into(), mount.minor.into());
        self.is_filesystem_root(dev, &mount.root)
    }

    fn is_filesystem_root(&self, dev: u64, root: &Path) -> bool {
        dev == self.dev && root == Path::new("/")
    }

    fn is_device_node(&self, fs_type: &str, root: &Path) -> bool {
        fs_type == "devtmpfs" && root == self.devtmpfs_root
    }

    /// Anything that keeps the volume's device in use: any mount of its filesystem
    /// (whatever the root) or a bind of its node.
    pub fn uses(&self, entry: &MountEntry) -> bool {
        entry.device_number() == self.dev || self.is_device_bind(entry)
    }
}

/// What the topmost mount at `path` is: this volume (`identity`, `None` when the volume
/// has no device, so nothing can be it), something else, or nothing.
pub(super) fn holding<'a>(table: &'a MountTable, path: &Path, identity: Option<&Identity>) -> Holding<'a> {
    match table.at(path) {
        None => Holding::Nothing,
        Some(e) if identity.is_some_and(|i| i.is_filesystem(e) || i.is_device_bind(e)) => Holding::This(e),
        Some(e) => Holding::Other(e),
    }
}

/// A mount strictly below `path`: mounting over `path` would hide it, and it is not ours.
pub(super) fn mount_below<'a>(table: &'a MountTable, path: &Path) -> Option<&'a MountEntry> {
    table
        .entries()
        .find(|e| e.mount_point != path && e.mount_point.starts_with(path))
}

/// How a mount is named in an error: what is mounted, and from where.
pub(super) fn describe(entry: &MountEntry) -> String {
    let root = if entry.root == Path::new("/") {
        String::new()
    } else {
        format!(" (bind of {})", entry.root.display())
    };
    format!("{} {}{root}", entry.fs_type, entry.source)
}

/// Refuses a path where something other than this volume is mounted.
pub(super) fn refuse_other(path: &Path, holding: &Holding<'_>) -> Result<(), VolumeError> {
    match holding {
        Holding::Other(e) => Err(VolumeError::Occupied {
            path: path.to_path_buf(),
            holder: describe(e),
        }),
        _ => Ok(()),
    }
}

/// Refuses a path with mounts below it: mounting over it would hide them.
pub(super) fn refuse_mounts_below(table: &MountTable, path: &Path) -> Result<(), VolumeError> {
    match mount_below(table, path) {
        Some(e) => Err(VolumeError::Occupied {
            path: path.to_path_buf(),
            holder: format!("{} mounted below it at {}", describe(e), e.mount_point.display()),
        }),
        None => Ok(()),
    }
}

impl Volumes {
    /// The volume's identity in the mount table; `None` when it has no device now.
    pub(super) async fn identity(
        &self,
        backend: &Backend,
        token: &Token,
    ) -> Result<Option<Identity>, VolumeError> {
        let Some(device) = backend.holding_device(token).await? else {
            return Ok(None);
        };
        self.identity_of_held(backend, token, device).await
    }

    /// The identity of the volume that `device` (its [`Backend::holding_device`])
    /// holds: for an encrypted volume whose mapping is open, the mapping's, which is
    /// what its mounts and binds are made of.
    pub(super) async fn identity_of_held(
        &self,
        backend: &Backend,
        token: &Token,
        device: PathBuf,
    ) -> Result<Option<Identity>, VolumeError> {
        let device = self.through_mapping(backend, token, device).await?;
        self.identity_of(&device).await
    }

    /// The identity of `device`, the volume's [`Backend::holding_device`]; `None` when
    /// its node is gone (detached since it was found, or a PMEM namespace disabled since
    /// the class's cached listing named its device).
    pub(super) async fn identity_of(&self, device: &Path) -> Result<Option<Identity>, VolumeError> {
        // Two independent lookups, at once.
        let (dev, devtmpfs_root) =
            tokio::join!(self.host.syscalls.device_number(device), devtmpfs_root(device));
        let dev = match dev {
            Ok(Some(dev)) => dev,
            Ok(None) => return Ok(None),
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(Some(Identity {
            dev,
            devtmpfs_root: devtmpfs_root?,
        }))
    }

    /// What an unpublish or unstage starts from: `path` checked for symbolic links, the
    /// volume's identity and the mount table, read at once (each is a trip to the
    /// blocking pool, unless the call has its own thread); errors in that order.
    pub(super) async fn look_at(
        &self,
        backend: &Backend,
        token: &Token,
        path: &Path,
    ) -> Result<(Option<Identity>, MountTable), VolumeError> {
        let (links, identity, table) = tokio::join!(
            check_no_symlinks(path),
            self.identity(backend, token),
            MountTable::read(&self.host)
        );
        links?;
        Ok((identity?, table?))
    }

    /// Whether the kernel shows nothing mounted at `path` nor below it, asked by path
    /// (statx, statmount) rather than read from the whole table; `false` when it cannot
    /// show that. An absent path is clear on any kernel.
    pub(super) async fn clear_at_and_below(&self, path: &Path) -> bool {
        match self.host.syscalls.mount_at(path).await {
            Ok(None) => nothing_below(path).await,
            Err(e) if e.is_not_found() => nothing_below(path).await,
            Ok(Some(_)) | Err(_) => false,
        }
    }

    /// The mount of this volume at `path` (its filesystem, or a bind of its raw device
    /// node), proven as for NodeGetVolumeStats: a symlink on the way, nothing or
    /// anything else mounted there is NOT_FOUND. (ReclaimSpace checks its paths so.)
    pub async fn mount_at(
        &self,
        backend: &Backend,
        id: &VolumeId,
        path: &HostPath,
    ) -> Result<MountEntry, VolumeError> {
        Ok(self.mounted_at(backend, id, Some(path)).await?.1)
    }

    /// The mount at `path`, proven to be this volume's, as [`mounted_at`](Self::mounted_at)
    /// proves it, but asking the kernel for that one mount (statmount) instead of reading
    /// the whole table: kubelet asks every volume's stats every minute, and a node with
    /// hundreds of volumes has a table of a thousand lines. Whatever the short way
    /// cannot confirm (another mount there, nothing, an older kernel) goes the long way,
    /// which answers as it always did.
    pub(super) async fn mount_of(
        &self,
        backend: &Backend,
        id: &VolumeId,
        path: Option<&HostPath>,
    ) -> Result<MountedAt, VolumeError> {
        let path = inside_roots(id, path)?;
        let (links, mounted, identity) = tokio::join!(
            check_no_symlinks(path),
            self.host.syscalls.mount_at(path),
            self.identity(backend, &id.token)
        );
        if links.is_err() {
            return Err(not_at(id, path));
        }
        let identity = identity?;
        if let (Ok(Some(mounted)), Some(identity)) = (mounted, identity.as_ref())
            && identity.is_shown_by(&mounted)
        {
            return Ok(mounted);
        }
        // The long way, with the symlink check and the identity already in hand.
        let table = MountTable::read(&self.host).await?;
        Ok(held_at(&table, id, path, identity.as_ref())?.mounted_at())
    }

    /// The bind at `path` of the volume's raw device node, once its device was removed
    /// under a publication (an encrypted volume's mapping closed by hand, a PMEM
    /// namespace disabled, a loop device detached). What proves a bind the volume's,
    /// its device's identity, went with the device; what proves this one is that this
    /// daemon published the volume at `path` ([`placed`](super::placed)) and that what
    /// is bound there is a device node ([`is_lost_bind`](Self::is_lost_bind)). `None`
    /// for anything else.
    pub(super) async fn lost_bind_at(
        &self,
        backend: &Backend,
        id: &VolumeId,
        path: Option<&HostPath>,
    ) -> Result<Option<MountedAt>, VolumeError> {
        let path = inside_roots(id, path)?;
        if !self.placed.is(id, path, Role::Publication) || check_no_symlinks(path).await.is_err() {
            return Ok(None);
        }
        let (mounted, identity) = tokio::join!(
            self.host.syscalls.mount_at(path),
            self.identity(backend, &id.token)
        );
        let mounted = match mounted {
            Ok(mounted) => mounted,
            // The kernel cannot say by path: the table can.
            Err(_) => MountTable::read(&self.host)
                .await?
                .at(path)
                .map(MountEntry::mounted_at),
        };
        let identity = identity?;
        Ok(match mounted {
            Some(bind) if self.is_lost_bind(&bind, identity.as_ref()).await => Some(bind),
            _ => None,
        })
    }

    /// Whether `mount`, at a path this daemon published the volume at, is a bind of a
    /// device node the volume no longer has: the node removed (the kernel shows an
    /// unlinked node's name with `//deleted` after it; one gone meanwhile, or made
    /// anew, is the same removal), or the volume has no device at all (`identity`
    /// `None`: a loop device detached, whose node stays). A bind of the volume's
    /// device now is no lost one.
    pub(super) async fn is_lost_bind(&self, mount: &MountedAt, identity: Option<&Identity>) -> bool {
        if mount.fs_type != "devtmpfs" || identity.is_some_and(|i| i.is_shown_by(mount)) {
            return false;
        }
        if identity.is_none() || mount.root.as_os_str().as_bytes().ends_with(b"//deleted") {
            return true;
        }
        let node = Path::new("/dev").join(mount.root.strip_prefix("/").unwrap_or(&mount.root));
        matches!(self.host.syscalls.device_number(&node).await, Err(e) if e.is_not_found())
    }

    /// The mount of this volume at `path` (its staging mount, a bind of it, or a bind of
    /// its device node); anything else, a symlink on the way or no path, is NOT_FOUND.
    pub(super) async fn mounted_at(
        &self,
        backend: &Backend,
        id: &VolumeId,
        path: Option<&HostPath>,
    ) -> Result<(MountTable, MountEntry), VolumeError> {
        let path = inside_roots(id, path)?;
        if check_no_symlinks(path).await.is_err() {
            return Err(not_at(id, path));
        }
        let table = MountTable::read(&self.host).await?;
        let identity = self.identity(backend, &id.token).await?;
        let entry = held_at(&table, id, path, identity.as_ref())?;
        Ok((table, entry))
    }
}

/// The path of a node call that named one below kubelet's roots.
fn inside_roots<'a>(id: &VolumeId, path: Option<&'a HostPath>) -> Result<&'a Path, VolumeError> {
    path.map(HostPath::as_path).ok_or_else(|| VolumeError::NotAtPath {
        id: id.clone(),
        path: "a path outside kubelet's root directory".to_string(),
    })
}

fn not_at(id: &VolumeId, path: &Path) -> VolumeError {
    VolumeError::NotAtPath {
        id: id.clone(),
        path: path.display().to_string(),
    }
}

/// This volume's mount at `path` in `table`; anything else there, or nothing, is NOT_FOUND.
fn held_at(
    table: &MountTable,
    id: &VolumeId,
    path: &Path,
    identity: Option<&Identity>,
) -> Result<MountEntry, VolumeError> {
    match holding(table, path, identity) {
        Holding::This(e) => Ok(e.clone()),
        Holding::Nothing | Holding::Other(_) => Err(not_at(id, path)),
    }
}

/// Where a raw block volume's device node appears in the mount table when bind-mounted:
/// devtmpfs, with the device's name below /dev as the mount root.
pub(super) async fn devtmpfs_root(device: &Path) -> Result<PathBuf, VolumeError> {
    let owned = device.to_path_buf();
    let resolved = crate::host::blocking::run(move || std::fs::canonicalize(owned))
        .await
        .map_err(|e| io_error("resolve", device)(std::io::Error::other(e)))?;
    let real = match resolved {
        Ok(real) => real,
        // A device node that vanished can still be named in the mount table as it was.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => device.to_path_buf(),
        Err(e) => return Err(io_error("resolve", device)(e)),
    };
    Ok(Path::new("/").join(real.strip_prefix("/dev").unwrap_or(&real)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
25 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw
30 22 0:40 / /k/tmpfs rw - tmpfs tmpfs rw
101 22 7:3 / /k/stage/a rw,relatime - ext4 /dev/loop3 rw
102 22 7:3 / /k/pods/1/mount rw,relatime - ext4 /dev/loop3 rw
103 22 7:3 /lost+found /k/pods/2/mount rw,relatime - ext4 /dev/loop3 rw
104 22 0:5 /loop4 /k/pods/3/dev rw,nosuid - devtmpfs udev rw
105 22 7:5 / /k/stage/b rw,relatime - ext4 /dev/loop5 rw
";

    fn loop3() -> Identity {
        Identity {
            dev: nix::sys::stat::makedev(7, 3),
            devtmpfs_root: "/loop3".into(),
        }
    }

    #[test]
    fn only_the_volumes_own_mounts_are_this() {
        let table = MountTable::parse(MOUNTINFO).unwrap();
        let a = loop3();
        let at = |p: &str, id: Option<&Identity>| match holding(&table, Path::new(p), id) {
            Holding::Nothing => "nothing",
            Holding::This(_) => "this",
            Holding::Other(_) => "other",
        };
        assert_eq!(at("/k/stage/a", Some(&a)), "this");
        assert_eq!(at("/k/pods/1/mount", Some(&a)), "this");
        assert_eq!(
            at("/k/pods/2/mount", Some(&a)),
            "other",
            "a bind of a subdirectory is not ours"
        );
        assert_eq!(
            at("/k/stage/b", Some(&a)),
            "other",
            "another volume's staging mount"
        );
        assert_eq!(at("/k/tmpfs", Some(&a)), "other");
        assert_eq!(
            at("/k/stage/a", None),
            "other",
            "no device: nothing mounted is ours"
        );
        assert_eq!(at("/k/nothing", Some(&a)), "nothing");
        let block = Identity {
            dev: 0,
            devtmpfs_root: "/loop4".into(),
        };
        assert_eq!(at("/k/pods/3/dev", Some(&block)), "this");
        assert_eq!(at("/k/pods/3/dev", Some(&a)), "other");
        assert!(a.uses(table.at(Path::new("/k/pods/2/mount")).unwrap()));
    }

    #[test]
    fn mounts_below_a_path_are_found() {
        let table = MountTable::parse(MOUNTINFO).unwrap();
        assert_eq!(
            mount_below(&table, Path::new("/k/pods")).unwrap().mount_point,
            Path::new("/k/pods/1/mount")
        );
        assert!(mount_below(&table, Path::new("/k/stage/a")).is_none());
        assert!(mount_below(&table, Path::new("/k/stag")).is_none());
        assert!(describe(table.at(Path::new("/k/pods/2/mount")).unwrap()).contains("bind of /lost+found"));
    }
}
