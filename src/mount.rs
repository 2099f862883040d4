//! Mounts: reading the mount table and turning CSI mount flags into mount(2) arguments.
//!
//! The mount table is the record of what is staged and published: localvol keeps no
//! other node state, so a restart (or a crash mid-call) loses nothing. Parsing is pure
//! and tested on captured /proc/self/mountinfo text.

use std::path::{Path, PathBuf};

use nix::mount::MsFlags;

use crate::host::{Host, MountCall, MountedAt, SyscallError};

pub mod fuzz;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("cannot parse mountinfo line {line:?}")]
    Parse { line: String },
    #[error("mount option {option:?} is not allowed: {reason}")]
    InvalidOption { option: String, reason: &'static str },
    #[error(transparent)]
    Syscall(#[from] SyscallError),
}

impl MountError {
    /// Whether the same request again cannot succeed (see [`crate::model::Terminal`]).
    pub fn is_terminal(&self) -> bool {
        match self {
            MountError::InvalidOption { .. } | MountError::Parse { .. } => true,
            MountError::Syscall(s) => s.is_terminal(),
        }
    }
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub major: u32,
    pub minor: u32,
    /// The path inside the source filesystem that is mounted (`/` unless a bind mount of a
    /// subdirectory or a device file).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options (`ro`, `nosuid`, ...).
    pub options: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// Per-superblock options (`dax=always`, `discard`, ...).
    pub super_options: Vec<String>,
}

impl MountEntry {
    pub fn is_read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }

    pub fn device_number(&self) -> u64 {
        nix::sys::stat::makedev(self.major.into(), self.minor.into())
    }

    /// The fields statmount(2) would give for this mount.
    pub fn mounted_at(&self) -> MountedAt {
        MountedAt {
            major: self.major,
            minor: self.minor,
            root: self.root.clone(),
            mount_point: self.mount_point.clone(),
            fs_type: self.fs_type.clone(),
            read_only: self.is_read_only(),
            sb_read_only: self.super_options.iter().any(|o| o == "ro"),
        }
    }
}

/// Undoes the octal escapes the kernel writes for space, tab, newline and backslash.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(value) = u8::try_from(value) {
                    out.push(value);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses /proc/self/mountinfo (proc(5)): `id parent major:minor root mountpoint options
/// [optional fields...] - fstype source superoptions`.
pub fn parse_mountinfo(text: &str) -> Result<Vec<MountEntry>, MountError> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Result<MountEntry, MountError> {
    let bad = || MountError::Parse {
        line: line.to_string(),
    };
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().position(|f| *f == "-").ok_or_else(bad)?;
    if separator < 6 || fields.len() < separator + 3 {
        return Err(bad());
    }
    let (major, minor) = fields[2].split_once(':').ok_or_else(bad)?;
    Ok(MountEntry {
        major: major.parse().map_err(|_| bad())?,
        minor: minor.parse().map_err(|_| bad())?,
        root: PathBuf::from(unescape(fields[3])),
        mount_point: PathBuf::from(unescape(fields[4])),
        options: fields[5].split(',').map(str::to_string).collect(),
        fs_type: fields[separator + 1].to_string(),
        source: unescape(fields[separator + 2]),
        super_options: fields
            .get(separator + 3)
            .map(|s| s.split(',').map(str::to_string).collect())
            .unwrap_or_default(),
    })
}

/// The mount table of this process's mount namespace.
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    entries: Vec<MountEntry>,
}

impl MountTable {
    pub async fn read(host: &Host) -> Result<Self, MountError> {
        Self::parse(&host.syscalls.mountinfo().await?)
    }

    /// A table from mountinfo text.
    pub fn parse(mountinfo: &str) -> Result<Self, MountError> {
        Ok(Self {
            entries: parse_mountinfo(mountinfo)?,
        })
    }

    pub fn entries(&self) -> impl Iterator<Item = &MountEntry> {
        self.entries.iter()
    }

    /// The topmost mount at exactly `path` (later lines stack over earlier ones).
    pub fn at(&self, path: &Path) -> Option<&MountEntry> {
        self.entries.iter().rev().find(|e| e.mount_point == path)
    }

    /// How many mounts are stacked at `path`.
    pub fn count_at(&self, path: &Path) -> usize {
        self.entries.iter().filter(|e| e.mount_point == path).count()
    }

    /// Mounts whose source is `device` (a filesystem on it, not bind mounts of the node).
    pub fn of_source<'a>(&'a self, device: &'a Path) -> impl Iterator<Item = &'a MountEntry> + 'a {
        self.entries
            .iter()
            .filter(move |e| Path::new(&e.source) == device && e.root == Path::new("/"))
    }
}

/// Mount flags as CSI carries them (`mount_flags`, each possibly comma-joined), turned
/// into mount(2)'s flag bits plus the filesystem-specific data string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub flags: MsFlags,
    pub data: Vec<String>,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            flags: MsFlags::empty(),
            data: Vec::new(),
        }
    }
}

/// How many mount flags a request or device class may give, and how long each may be:
/// real ones are a handful of short words.
pub const MAX_MOUNT_FLAGS: usize = 64;
pub const MAX_MOUNT_FLAG_BYTES: usize = 256;

/// Filesystem options (the part of an option before `=`) localvol passes on to ext4 or
/// xfs; anything else is refused rather than left for mount(2) to puzzle over.
#[rustfmt::skip]
const DATA_OPTIONS: &[&str] = &[
    // Both filesystems, and the VFS's SELinux labels.
    "discard", "nodiscard", "dax", "barrier", "nobarrier", "norecovery", "usrquota", "grpquota",
    "prjquota", "quota", "noquota", "context", "fscontext", "defcontext", "rootcontext",
    // ext4 (ext4(5)).
    "errors", "data", "commit", "journal_checksum", "nojournal_checksum", "journal_async_commit",
    "noload", "user_xattr", "nouser_xattr", "acl", "noacl", "usrjquota", "grpjquota", "jqfmt",
    "inode_readahead_blks", "stripe", "delalloc", "nodelalloc", "max_batch_time",
    "min_batch_time", "journal_ioprio", "auto_da_alloc", "noauto_da_alloc", "init_itable",
    "noinit_itable", "block_validity", "noblock_validity", "dioread_lock", "dioread_nolock",
    "i_version", "nombcache", "resuid", "resgid", "grpid", "bsdgroups", "nogrpid", "sysvgroups",
    "data_err", "journal_path", "journal_dev",
    // xfs (xfs(5)).
    "allocsize", "attr2", "noattr2", "filestreams", "ikeep", "noikeep", "inode32", "inode64",
    "largeio", "nolargeio", "logbufs", "logbsize", "logdev", "rtdev", "noalign", "nouuid",
    "sunit", "swidth", "swalloc", "wsync", "uquota", "gquota", "pquota", "uqnoenforce",
    "gqnoenforce", "pqnoenforce", "qnoenforce",
];

impl MountOptions {
    pub fn parse<S: AsRef<str>>(options: &[S]) -> Result<Self, MountError> {
        let mut parsed = MountOptions::default();
        if options.len() > MAX_MOUNT_FLAGS {
            return Err(MountError::InvalidOption {
                option: format!("{} flags", options.len()),
                reason: "more mount flags than localvol accepts (64)",
            });
        }
        if let Some(long) = options.iter().find(|o| o.as_ref().len() > MAX_MOUNT_FLAG_BYTES) {
            return Err(MountError::InvalidOption {
                option: long.as_ref().chars().take(64).collect(),
                reason: "longer than the 256 bytes localvol accepts for a mount flag",
            });
        }
        for option in options.iter().flat_map(|o| o.as_ref().split(',')) {
            if option.is_empty() || option == "defaults" {
                continue;
            }
            let invalid = |reason| MountError::InvalidOption {
                option: option.to_string(),
                reason,
            };
            if !option
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_=.:/+-".contains(&b))
                || option.starts_with('-')
            {
                return Err(invalid("only letters, digits and _=.:/+- are allowed"));
            }
            match option {
                "bind" | "rbind" | "remount" | "move" | "shared" | "rshared" | "private" | "rprivate"
                | "slave" | "rslave" | "unbindable" => {
                    return Err(invalid("mount topology is chosen by localvol"));
                }
                _ => {}
            }
            match flag_of(option) {
                Some(FlagEffect::Set(f)) => parsed.flags |= f,
                Some(FlagEffect::Clear(f)) => parsed.flags &= !f,
                None => {
                    let key = option.split_once('=').map_or(option, |(key, _)| key);
                    if !DATA_OPTIONS.contains(&key) {
                        return Err(invalid("not a mount option localvol knows for ext4 or xfs"));
                    }
                    if !parsed.data.iter().any(|d| d == option) {
                        parsed.data.push(option.to_string());
                    }
                }
            }
        }
        Ok(parsed)
    }

    pub fn read_only(&self) -> bool {
        self.flags.contains(MsFlags::MS_RDONLY)
    }

    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.flags.set(MsFlags::MS_RDONLY, read_only);
        self
    }

    pub fn with_data(mut self, option: &str) -> Self {
        if !self.data.iter().any(|d| d == option) {
            self.data.push(option.to_string());
        }
        self
    }

    pub fn data_string(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }

    /// The call that mounts filesystem `fs_type` on `device` at `target`.
    pub fn filesystem_call(&self, device: &Path, target: &Path, fs_type: &str) -> MountCall {
        MountCall {
            source: device.to_path_buf(),
            target: target.to_path_buf(),
            fs_type: Some(fs_type.to_string()),
            flags: self.flags,
            data: self.data_string(),
        }
    }
}

enum FlagEffect {
    Set(MsFlags),
    Clear(MsFlags),
}

fn flag_of(option: &str) -> Option<FlagEffect> {
    use FlagEffect::{Clear, Set};
    Some(match option {
        "ro" => Set(MsFlags::MS_RDONLY),
        "rw" => Clear(MsFlags::MS_RDONLY),
        "nosuid" => Set(MsFlags::MS_NOSUID),
        "suid" => Clear(MsFlags::MS_NOSUID),
        "nodev" => Set(MsFlags::MS_NODEV),
        "dev" => Clear(MsFlags::MS_NODEV),
        "noexec" => Set(MsFlags::MS_NOEXEC),
        "exec" => Clear(MsFlags::MS_NOEXEC),
        "sync" => Set(MsFlags::MS_SYNCHRONOUS),
        "async" => Clear(MsFlags::MS_SYNCHRONOUS),
        "dirsync" => Set(MsFlags::MS_DIRSYNC),
        "noatime" => Set(MsFlags::MS_NOATIME),
        "atime" => Clear(MsFlags::MS_NOATIME),
        "nodiratime" => Set(MsFlags::MS_NODIRATIME),
        "diratime" => Clear(MsFlags::MS_NODIRATIME),
        "relatime" => Set(MsFlags::MS_RELATIME),
        "norelatime" => Clear(MsFlags::MS_RELATIME),
        "strictatime" => Set(MsFlags::MS_STRICTATIME),
        "lazytime" => Set(MsFlags::MS_LAZYTIME),
        "nolazytime" => Clear(MsFlags::MS_LAZYTIME),
        _ => return None,
    })
}

/// Bind-mounts `source` onto `target`, then applies read-only in a second call: the
/// kernel ignores MS_RDONLY on the first MS_BIND call.
pub async fn bind(host: &Host, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
    host.syscalls
        .mount(MountCall {
            source: source.to_path_buf(),
            target: target.to_path_buf(),
            fs_type: None,
            flags: MsFlags::MS_BIND,
            data: None,
        })
        .await?;
    if read_only {
        let remount = MountCall {
            source: source.to_path_buf(),
            target: target.to_path_buf(),
            fs_type: None,
            flags: MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            data: None,
        };
        if let Err(e) = host.syscalls.mount(remount).await {
            // Never leave a writable mount behind where a read-only one was asked for.
            let _ = host.syscalls.umount(target).await;
            return Err(e.into());
        }
    }
    Ok(())
}

/// Unmounts the topmost mount at `target`. Not mounted is success.
pub async fn unmount(host: &Host, target: &Path) -> Result<(), MountError> {
    match host.syscalls.umount(target).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_not_mounted() || e.is_not_found() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
25 22 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=10240k,nr_inodes=1
101 22 7:3 / /var/lib/kubelet/plugins/kubernetes.io/csi/localvol.csi.dev/abc/globalmount rw,relatime shared:50 - ext4 /dev/loop3 rw
102 22 7:3 / /var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pvc-1/mount ro,relatime shared:50 - ext4 /dev/loop3 rw
103 22 0:5 /loop4 /var/lib/kubelet/pods/uid/volumeDevices/x/pvc-2 rw,nosuid shared:2 - devtmpfs udev rw,size=10240k
104 22 7:5 / /mnt/with\\040space rw - xfs /dev/loop5 rw,dax=always
";

    #[test]
    fn parses_kernel_mountinfo() {
        let entries = parse_mountinfo(MOUNTINFO).unwrap();
        assert_eq!(entries.len(), 6);
        let stage = &entries[2];
        assert_eq!((stage.major, stage.minor), (7, 3));
        assert_eq!(stage.fs_type, "ext4");
        assert_eq!(stage.source, "/dev/loop3");
        assert!(!stage.is_read_only());
        assert!(entries[3].is_read_only());
        assert_eq!(entries[4].root, Path::new("/loop4"));
        assert_eq!(entries[5].mount_point, Path::new("/mnt/with space"));
        assert_eq!(entries[5].super_options, vec!["rw", "dax=always"]);
    }

    #[test]
    fn mountinfo_without_optional_fields_parses() {
        let e = parse_mountinfo("36 35 98:0 /mnt1 /mnt2 rw,noatime - ext3 /dev/root rw,errors=continue\n")
            .unwrap();
        assert_eq!(e[0].root, Path::new("/mnt1"));
        assert_eq!(e[0].source, "/dev/root");
    }

    #[test]
    fn malformed_mountinfo_is_an_error() {
        assert!(matches!(
            parse_mountinfo("1 2 3\n"),
            Err(MountError::Parse { .. })
        ));
        assert!(parse_mountinfo("1 2 x:y / /a rw - ext4 /dev/a rw").is_err());
    }

    #[test]
    fn table_finds_the_topmost_mount() {
        let text = format!("{MOUNTINFO}105 22 7:9 / /mnt/with\\040space rw - ext4 /dev/loop9 rw\n");
        let table = MountTable {
            entries: parse_mountinfo(&text).unwrap(),
        };
        let top = table.at(Path::new("/mnt/with space")).unwrap();
        assert_eq!(top.source, "/dev/loop9");
        assert_eq!(table.count_at(Path::new("/mnt/with space")), 2);
        assert_eq!(table.of_source(Path::new("/dev/loop3")).count(), 2);
        assert!(table.at(Path::new("/nope")).is_none());
    }

    #[test]
    fn options_split_into_flags_and_data() {
        let o = MountOptions::parse(&["noatime,nodev", "discard", "ro", "errors=remount-ro"]).unwrap();
        assert!(
            o.flags
                .contains(MsFlags::MS_NOATIME | MsFlags::MS_NODEV | MsFlags::MS_RDONLY)
        );
        assert_eq!(o.data_string().as_deref(), Some("discard,errors=remount-ro"));
        let o = MountOptions::parse(&["ro", "rw", "defaults", ""]).unwrap();
        assert!(!o.read_only());
        assert_eq!(o.data_string(), None);
    }

    #[test]
    fn hostile_options_are_refused() {
        let long = "a".repeat(5000);
        let many = vec!["noatime"; 65];
        assert!(MountOptions::parse(&[long.as_str()]).is_err());
        assert!(MountOptions::parse(&many).is_err());
        assert!(MountOptions::parse(&vec!["noatime"; 64]).is_ok());
        for bad in [
            "bind",
            "rbind",
            "shared",
            "-o",
            "a b",
            "x;y",
            "$(id)",
            "opt\n",
            "x-gvfs-show",
            "loop",
            "offset=0",
            "uid=0",
            "user",
            "unknown=1",
        ] {
            assert!(
                matches!(MountOptions::parse(&[bad]), Err(MountError::InvalidOption { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn unescape_handles_edges() {
        assert_eq!(unescape("a\\040b\\134c"), "a b\\c");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
        assert_eq!(unescape("\\"), "\\");
    }
}
